package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

type quotaFlags struct {
	tenant, channel, recipient string
	json, yes                  bool
}

func newQuotaCmd() *cobra.Command {
	var f quotaFlags
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Show or reset a tenant's send quotas",
		Long: `Show or reset the quota windows of a tenant (tenant-wide rules) and, with
--recipient, of one recipient. Rules come from SLUICE_RULES; recipients are
looked up by SLUICE_SUBJECT_SECRET, which must match the workers'.`,
	}
	flags := func(c *cobra.Command) {
		c.Flags().StringVar(&f.tenant, "tenant", "", "tenant id (required)")
		c.Flags().StringVar(&f.channel, "channel", "", "email or sms (default: both)")
		c.Flags().StringVar(&f.recipient, "recipient", "", "also the recipient's rules: an address or E.164 number")
	}
	show := &cobra.Command{
		Use:   "show",
		Short: "Per rule: used, remaining, when the next slot frees",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lim, limits, slack, err := quotaLimits(f)
			if err != nil {
				return err
			}
			us, err := lim.Usage(cmd.Context(), f.tenant, slack, limits...)
			if err != nil {
				return err
			}
			return printUsage(cmd, us, f.json)
		},
	}
	flags(show)
	show.Flags().BoolVar(&f.json, "json", false, "print JSON")
	reset := &cobra.Command{
		Use:   "reset",
		Short: "Forget every send in the selected windows (asks first)",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lim, limits, _, err := quotaLimits(f)
			if err != nil {
				return err
			}
			if !f.yes {
				fmt.Fprintf(cmd.OutOrStdout(), "Reset %d quota windows of tenant %s", len(limits), f.tenant)
				if f.recipient != "" {
					fmt.Fprintf(cmd.OutOrStdout(), " and recipient %s", tasks.Mask(f.recipient))
				}
				fmt.Fprint(cmd.OutOrStdout(), "? Sends already made will no longer count. [y/N] ")
				answer, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if err != nil {
					fmt.Fprintln(cmd.OutOrStdout()) // no answer: end the prompt's line
				}
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					return errors.New("not confirmed; nothing reset (use --yes to skip the question)")
				}
			}
			if err := lim.Reset(cmd.Context(), f.tenant, limits...); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reset %d windows\n", len(limits))
			return nil
		},
	}
	flags(reset)
	reset.Flags().BoolVar(&f.yes, "yes", false, "do not ask for confirmation")
	cmd.AddCommand(show, reset)
	return cmd
}

func quotaLimits(f quotaFlags) (*throttle.Limiter, []throttle.Limit, time.Duration, error) {
	if err := tasks.CheckTenant(f.tenant); err != nil {
		return nil, nil, 0, usageError{fmt.Errorf("--tenant: %w", err)}
	}
	channels := []tasks.Channel{tasks.Email, tasks.SMS}
	if f.channel != "" {
		ch := tasks.Channel(f.channel)
		if _, err := ch.TaskType(); err != nil {
			return nil, nil, 0, usageError{fmt.Errorf("--channel: %w", err)}
		}
		channels = []tasks.Channel{ch}
	}
	cfg, err := worker.ReadConfig(nil)
	if err != nil {
		return nil, nil, 0, err
	}
	policy, err := worker.ParsePolicy(cfg.Rules)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("SLUICE_RULES: %w", err)
	}
	var limits []throttle.Limit
	for _, ch := range channels {
		rcpt := f.recipient
		if rcpt != "" {
			rcpt = tasks.Notification{Channel: ch, To: rcpt}.Normalized().To
		}
		for _, s := range policy.Specs(f.tenant, ch) {
			if s.Scope == worker.ScopeRecipient && rcpt == "" {
				continue
			}
			limits = append(limits, s.Limit(rcpt))
		}
	}
	if len(limits) == 0 {
		return nil, nil, 0, usageError{errors.New("no rules apply; tenant-wide rules need SLUICE_RULES, recipient rules need --recipient")}
	}
	rdb, err := worker.NewRedisClient(cfg)
	if err != nil {
		return nil, nil, 0, err
	}
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte(cfg.SubjectSecret), CompactMembers: cfg.CompactMembers})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("SLUICE_SUBJECT_SECRET: %w", err)
	}
	return lim, limits, cfg.SendSlack, nil
}

type usageJSON struct {
	Scope     string    `json:"scope"`
	Rule      string    `json:"rule"`
	Limit     int       `json:"limit"`
	Window    string    `json:"window"`
	Used      int       `json:"used"`
	Remaining int       `json:"remaining"`
	Booked    int       `json:"booked"`
	Oldest    time.Time `json:"oldest,omitzero"`
	NextFree  time.Time `json:"next_free"`
	ResetAt   time.Time `json:"reset_at"`
}

func printUsage(cmd *cobra.Command, us []throttle.Usage, asJSON bool) error {
	out := cmd.OutOrStdout()
	if asJSON {
		rows := make([]usageJSON, len(us))
		for i, u := range us {
			rows[i] = usageJSON{Scope: u.Limit.Scope, Rule: u.Limit.Rule.String(), Limit: u.Limit.Rule.Limit,
				Window: throttle.FormatWindow(u.Limit.Rule.Window), Used: u.Used, Remaining: u.Remaining, Booked: u.Booked,
				Oldest: u.Oldest.UTC(), NextFree: u.NextFree.UTC(), ResetAt: u.ResetAt.UTC()}
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tRULE\tUSED\tREMAINING\tBOOKED\tNEXT SLOT\tWINDOW EMPTY")
	for _, u := range us {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", u.Limit.Scope, u.Limit.Rule, u.Used, u.Remaining, u.Booked,
			inDuration(u.NextFree.Sub(u.Now)), inDuration(u.ResetAt.Sub(u.Now)))
	}
	return tw.Flush()
}

func inDuration(d time.Duration) string {
	if d <= 0 {
		return "now"
	}
	return "in " + d.Round(100*time.Millisecond).String()
}
