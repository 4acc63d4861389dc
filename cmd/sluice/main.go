// Command sluice runs Sluice's throttled notification worker and its tools.
//
//	sluice worker                 run the worker (config from SLUICE_* env)
//	sluice api                    serve the HTTP ingest API
//	sluice enqueue sms|email ...  enqueue one notification
//	sluice enqueue --file F       enqueue a JSON Lines file
//	sluice quota show|reset ...   inspect or reset a tenant's quotas
//	sluice dkim record            the DNS TXT record of the DKIM key
//	sluice webhook set|show|remove a tenant's email provider webhooks
//	sluice dev                    an embedded demo: no Redis, no config
//
// Exit codes: 0 success; 1 failure (bad input, Redis trouble, a refused
// confirmation); 2 usage error; 3 partly done (enqueue --file
// --continue-on-error enqueued the good lines and rejected others).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// usageError marks errors that are the caller's words, not the world's.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// partialError marks a run that did part of its work (exit code 3).
type partialError struct{ error }

func (e partialError) Unwrap() error { return e.error }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the command tree and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "sluice:", err)
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "Run 'sluice --help' for usage.")
		return 2
	}
	var pe partialError
	if errors.As(err, &pe) {
		return 3
	}
	return 1
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "Notification worker with exact, Redis-backed send quotas",
		Long: `Sluice sends email and SMS notifications queued on Asynq (Redis). Before every
send it asks an exact sliding-window-log limiter whether the recipient's and
the tenant's quotas allow it; a denied notification is rescheduled for the
moment its slot opens, never failed or dropped.

Configuration comes from SLUICE_* environment variables (docs/configuration.md).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// The tools warn about unknown SLUICE_* variables; the worker refuses them.
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) {
		for c := cmd; c != nil; c = c.Parent() {
			if c.Name() == "enqueue" || c.Name() == "quota" || c.Name() == "tenant" || c.Name() == "suppression" || c.Name() == "webhook" {
				warnUnknownVariables(cmd)
				return
			}
		}
	}
	root.AddCommand(newWorkerCmd(), newAPICmd(), newEnqueueCmd(), newQuotaCmd(), newDevCmd(), newHealthCmd(), newKeygenCmd(), newTenantCmd(), newTemplateCmd(), newSuppressionCmd(), newDKIMCmd(), newWebhookCmd())
	return root
}

// argsError wraps cobra's positional-argument checks as usage errors.
func argsError(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}
