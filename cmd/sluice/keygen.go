package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/tasks"
)

func newKeygenCmd() *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Print a new payload key for SLUICE_PAYLOAD_KEYS",
		Long: `Print a new 32-byte payload key as ID:BASE64KEY, the form SLUICE_PAYLOAD_KEYS
takes. To rotate keys, put the new key first and keep the old one after it
until no task sealed with it is left:

  SLUICE_PAYLOAD_KEYS="$(sluice keygen),$SLUICE_PAYLOAD_KEYS"`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id == "" {
				id = "k" + time.Now().UTC().Format("20060102")
			}
			if _, err := tasks.ParseKeyring(tasks.NewKeySpec(id)); err != nil {
				return usageError{fmt.Errorf("--id: %w", err)}
			}
			fmt.Fprintln(cmd.OutOrStdout(), tasks.NewKeySpec(id))
			return nil
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "key id, 1–32 of A-Z a-z 0-9 _ - (default k<today's date>)")
	return cmd
}
