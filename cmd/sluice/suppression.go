package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
)

func newSuppressionCmd() *cobra.Command {
	var tenant, to string
	cmd := &cobra.Command{
		Use:   "suppression",
		Short: "Check or lift the suppression of an SMS recipient",
		Long: `A number the provider refused for good (a code of SLUICE_SMS_SUPPRESS_CODES, from
a refused send or a status callback) is on its tenant's suppression list for
SLUICE_SMS_SUPPRESS_TTL: SMS to it are archived unsent, reason suppressed.
Numbers are looked up by SLUICE_SUBJECT_SECRET, which must match the workers'.`,
	}
	// open checks the flags and returns the store of the configured Redis.
	open := func() (*delivery.Store, string, func(), error) {
		if err := tasks.CheckTenant(tenant); err != nil {
			return nil, "", nil, usageError{fmt.Errorf("--tenant: %w", err)}
		}
		number := tasks.NormalizePhone(to)
		if !tasks.IsE164(number) {
			return nil, "", nil, usageError{fmt.Errorf("--to: %q is not an E.164 number (+ and 7–15 digits)", tasks.Mask(to))}
		}
		d, _, err := openTool(false)
		if err != nil {
			return nil, "", nil, err
		}
		return delivery.NewStore(d.Redis, d.Limiter), number, d.Close, nil
	}
	flags := func(c *cobra.Command) {
		c.Flags().StringVar(&tenant, "tenant", "", "tenant id (required)")
		c.Flags().StringVar(&to, "to", "", "the recipient's E.164 number (required)")
	}
	check := &cobra.Command{
		Use:   "check",
		Short: "Say whether a number is suppressed, and by which provider code",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, number, done, err := open()
			if err != nil {
				return err
			}
			defer done()
			code, on, err := s.Suppressed(cmd.Context(), tenant, tasks.SMS, number)
			if err != nil {
				return err
			}
			if on {
				fmt.Fprintf(cmd.OutOrStdout(), "%s is suppressed for %s (provider code %d)\n", tasks.Mask(number), tenant, code)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%s is not suppressed for %s\n", tasks.Mask(number), tenant)
			}
			return nil
		},
	}
	remove := &cobra.Command{
		Use:   "remove",
		Short: "Take a number off the tenant's suppression list",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, number, done, err := open()
			if err != nil {
				return err
			}
			defer done()
			was, err := s.Unsuppress(cmd.Context(), tenant, tasks.SMS, number)
			if err != nil {
				return err
			}
			if was {
				fmt.Fprintf(cmd.OutOrStdout(), "%s is no longer suppressed for %s\n", tasks.Mask(number), tenant)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%s was not suppressed for %s; nothing changed\n", tasks.Mask(number), tenant)
			}
			return nil
		},
	}
	flags(check)
	flags(remove)
	cmd.AddCommand(check, remove)
	return cmd
}
