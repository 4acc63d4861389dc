package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/services"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
)

// newSuppressionCmd is `sluice suppression check|add|remove|ledger|migrate`.
func newSuppressionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "suppression",
		Short: "Show, add or lift a recipient's suppressions, and read its consent ledger",
		Long: `Every recipient has, per tenant and channel, suppressions the workers check inside
the quota check: undeliverable (a hard bounce, a provider's code of
SLUICE_SMS_SUPPRESS_CODES), opted out of every category or of some (STOP, a
one-click unsubscribe, the API), and a ledger of each event with when and how.
A blocked send is archived unsent, reason suppressed.
Recipients are looked up by SLUICE_SUBJECT_SECRET, which must match the workers';
they are printed masked.`,
	}
	cmd.AddCommand(newSuppressionCheckCmd(), newSuppressionAddCmd(), newSuppressionRemoveCmd(),
		newSuppressionLedgerCmd(), newSuppressionMigrateCmd())
	return cmd
}

// recipientFlags name the recipient a suppression command acts on.
type recipientFlags struct{ tenant, to, channel string }

// register adds --tenant, --to and --channel to c.
func (f *recipientFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.tenant, "tenant", "", "tenant id (required)")
	c.Flags().StringVar(&f.to, "to", "", "the recipient: an E.164 number (sms) or an address (email) (required)")
	c.Flags().StringVar(&f.channel, "channel", "sms", "sms, email or whatsapp")
}

// suppressionTarget is a checked recipient and the consent store that holds
// its suppressions.
type suppressionTarget struct {
	deps  *services.Set
	store *consent.Store
	ch    tasks.Channel
	to    string // normalized
	done  func()
}

// open checks the flags and returns the consent store of the configured Redis.
func (f recipientFlags) open() (suppressionTarget, error) {
	if err := tasks.CheckTenant(f.tenant); err != nil {
		return suppressionTarget{}, usageError{fmt.Errorf("--tenant: %w", err)}
	}
	ch := tasks.Channel(f.channel)
	if ch != tasks.SMS && ch != tasks.Email && ch != tasks.WhatsApp {
		return suppressionTarget{}, usageError{fmt.Errorf("--channel: %q: want sms, email or whatsapp", f.channel)}
	}
	if err := tasks.CheckRecipient(ch, f.to); err != nil {
		return suppressionTarget{}, usageError{fmt.Errorf("--to: %q is not an %s recipient (an E.164 number for sms and whatsapp, an address for email)", tasks.Mask(f.to), ch)}
	}
	d, _, err := openTool(false)
	if err != nil {
		return suppressionTarget{}, err
	}
	return suppressionTarget{d, d.Consent, ch, tasks.Notification{Channel: ch, To: f.to}.Normalized().To, d.Close}, nil
}

// newSuppressionCheckCmd is `sluice suppression check`.
func newSuppressionCheckCmd() *cobra.Command {
	var f recipientFlags
	var category string
	check := &cobra.Command{
		Use:   "check",
		Short: "Say what blocks sends to a recipient (with --category, whether a send of it goes)",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tg, err := f.open()
			if err != nil {
				return err
			}
			defer tg.done()
			st, err := tg.store.State(cmd.Context(), f.tenant, tg.ch, tg.to)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			who := fmt.Sprintf("%s (%s)", tasks.Mask(tg.to), tg.ch)
			if category != "" {
				return checkCategory(cmd, tg, f.tenant, category, who)
			}
			if st.Empty() {
				fmt.Fprintf(out, "%s is not suppressed for %s\n", who, f.tenant)
				return nil
			}
			fmt.Fprintf(out, "%s is suppressed for %s:\n", who, f.tenant)
			writeState(out, st)
			return nil
		},
	}
	check.Flags().StringVar(&category, "category", "", "a category: say whether a send of it is blocked")
	f.register(check)
	return check
}

// checkCategory prints whether a send of category to the target (named
// masked, as shown) is blocked, with the tenant's consent exemptions in force.
func checkCategory(cmd *cobra.Command, tg suppressionTarget, tenant, category, shown string) error {
	if err := tasks.CheckCategory(category); err != nil {
		return usageError{fmt.Errorf("--category: %w", err)}
	}
	policy, err := tg.deps.LoadPlans(cmd.Context())
	if err != nil {
		return err
	}
	v, err := tg.store.Check(cmd.Context(), tenant, tg.ch, tg.to, category, policy.ConsentExempt(tenant, tg.ch, category))
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if v.Blocked() {
		fmt.Fprintf(out, "a send of category %s to %s for %s is blocked: %s\n", category, shown, tenant, v.Reason)
	} else {
		fmt.Fprintf(out, "a send of category %s to %s for %s is not blocked\n", category, shown, tenant)
	}
	return nil
}

// newSuppressionAddCmd is `sluice suppression add`.
func newSuppressionAddCmd() *cobra.Command {
	var f recipientFlags
	var action, scope, until string
	add := &cobra.Command{
		Use:   "add",
		Short: "Record an opt-out or an undeliverable mark (source cli)",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := cliEvent(action, scope, until)
			if err != nil {
				return err
			}
			tg, err := f.open()
			if err != nil {
				return err
			}
			defer tg.done()
			rec, err := tg.store.Record(cmd.Context(), f.tenant, tg.ch, tg.to, e)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "recorded for %s (%s), tenant %s: %s\n", tasks.Mask(tg.to), tg.ch, f.tenant, describe(rec))
			return nil
		},
	}
	add.Flags().StringVar(&action, "action", "out", "out (an opt-out) or undeliverable")
	add.Flags().StringVar(&scope, "scope", "*", `the categories opted out of: "*" (every one) or names separated by commas`)
	add.Flags().StringVar(&until, "until", "", "how long the mark holds, e.g. 720h (default: until lifted)")
	f.register(add)
	return add
}

// cliEvent is the consent event that add's --action, --scope and --until
// describe, or a usage error naming the flag at fault.
func cliEvent(action, scope, until string) (consent.Event, error) {
	e := consent.Event{Source: consent.SourceCLI, Action: consent.Action(action), Scope: consent.AllCategories()}
	if e.Action != consent.OptOut && e.Action != consent.Undeliverable {
		return e, usageError{fmt.Errorf("--action: %q: want out or undeliverable", action)}
	}
	if scope != "*" {
		sc, err := consent.ParseScope(scope)
		if err != nil {
			return e, usageError{fmt.Errorf("--scope: %w", err)}
		}
		if e.Action == consent.Undeliverable {
			return e, usageError{errors.New("--scope: an undeliverable mark covers every category")}
		}
		e.Scope = sc
	}
	if until != "" {
		d, err := time.ParseDuration(until)
		if err != nil || d <= 0 {
			return e, usageError{fmt.Errorf("--until: %q: want a duration such as 720h", until)}
		}
		e.Until = time.Now().Add(d)
	}
	if err := e.Validate(); err != nil {
		return e, usageError{err}
	}
	return e, nil
}

// newSuppressionRemoveCmd is `sluice suppression remove`.
func newSuppressionRemoveCmd() *cobra.Command {
	var f recipientFlags
	remove := &cobra.Command{
		Use:   "remove",
		Short: "Lift every suppression of a recipient (an opt-in of every category, source cli)",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tg, err := f.open()
			if err != nil {
				return err
			}
			defer tg.done()
			st, err := tg.store.State(cmd.Context(), f.tenant, tg.ch, tg.to)
			if err != nil && !errors.Is(err, consent.ErrUnreadable) {
				return err
			}
			if err == nil && st.Empty() {
				fmt.Fprintf(cmd.OutOrStdout(), "%s was not suppressed for %s; nothing changed\n", tasks.Mask(tg.to), f.tenant)
				return nil
			}
			if _, err := tg.store.Record(cmd.Context(), f.tenant, tg.ch, tg.to,
				consent.Event{Action: consent.OptIn, Source: consent.SourceCLI, Scope: consent.AllCategories()}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is no longer suppressed for %s\n", tasks.Mask(tg.to), f.tenant)
			return nil
		},
	}
	f.register(remove)
	return remove
}

// newSuppressionLedgerCmd is `sluice suppression ledger`.
func newSuppressionLedgerCmd() *cobra.Command {
	var f recipientFlags
	ledger := &cobra.Command{
		Use:   "ledger",
		Short: "Print a recipient's consent ledger: every opt-out, opt-in and mark, oldest first",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tg, err := f.open()
			if err != nil {
				return err
			}
			defer tg.done()
			events, err := tg.store.Ledger(cmd.Context(), f.tenant, tg.ch, tg.to)
			for _, e := range events {
				fmt.Fprintf(cmd.OutOrStdout(), "%s  %s\n", e.At.Format(time.RFC3339), describe(e))
			}
			if len(events) == 0 && err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "no events for %s (%s), tenant %s\n", tasks.Mask(tg.to), tg.ch, f.tenant)
			}
			return err
		},
	}
	f.register(ledger)
	return ledger
}

// newSuppressionMigrateCmd is `sluice suppression migrate`.
func newSuppressionMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Move the suppression lists of Sluice before consent into the consent store (workers do it at start)",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, _, err := openTool(false)
			if err != nil {
				return err
			}
			defer d.Close()
			n, err := d.Consent.MigrateDelivery(cmd.Context())
			fmt.Fprintf(cmd.OutOrStdout(), "%d suppression entries moved\n", n)
			return err
		},
	}
}

// describe writes one event for a person.
func describe(e consent.Event) string {
	var b strings.Builder
	switch e.Action {
	case consent.OptOut:
		b.WriteString("opted out of ")
	case consent.OptIn:
		b.WriteString("opted in to ")
	case consent.Undeliverable:
		b.WriteString("undeliverable, ")
	case consent.Review:
		b.WriteString("for review (a reply that reads like a revocation), ")
	}
	if e.Scope.All {
		b.WriteString("every category")
	} else {
		b.WriteString("categories " + e.Scope.String())
	}
	fmt.Fprintf(&b, "; source %s", e.Source)
	if e.Keyword != "" {
		fmt.Fprintf(&b, ", keyword %s", e.Keyword)
	}
	if e.Code != 0 {
		fmt.Fprintf(&b, ", code %d", e.Code)
	}
	if !e.Until.IsZero() {
		fmt.Fprintf(&b, ", until %s", e.Until.Format(time.RFC3339))
	}
	if e.Ref != "" {
		fmt.Fprintf(&b, ", ref %s", e.Ref)
	}
	return b.String()
}

func writeMark(w io.Writer, what string, m consent.Mark) {
	fmt.Fprintf(w, "  %s since %s (source %s", what, m.At.Format(time.RFC3339), m.Source)
	if m.Code != 0 {
		fmt.Fprintf(w, ", code %d", m.Code)
	}
	if !m.Until.IsZero() {
		fmt.Fprintf(w, ", until %s", m.Until.Format(time.RFC3339))
	}
	fmt.Fprintln(w, ")")
}

func writeState(w io.Writer, st consent.State) {
	if st.Undeliverable != nil {
		writeMark(w, "undeliverable: every category, exempt ones too,", *st.Undeliverable)
	}
	if st.All != nil {
		writeMark(w, "opted out of every category but exempt ones", *st.All)
	}
	for _, group := range []struct {
		what  string
		marks map[string]consent.Mark
	}{{"opted out of", st.OptedOut}, {"opted back in to", st.OptedIn}} {
		cats := make([]string, 0, len(group.marks))
		for c := range group.marks {
			cats = append(cats, c)
		}
		sort.Strings(cats)
		for _, c := range cats {
			writeMark(w, group.what+" "+c, group.marks[c])
		}
	}
}
