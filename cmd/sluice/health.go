package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"
)

// newHealthCmd is for container healthchecks on images without curl.
func newHealthCmd() *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 if the worker's readiness endpoint answers 200 (for container healthchecks)",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := http.Client{Timeout: 3 * time.Second}
			resp, err := c.Get(url)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "ok")
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "url", "http://127.0.0.1:9090/readyz", "URL to check")
	return cmd
}
