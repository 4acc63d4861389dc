package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/services"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/report"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

type quotaFlags struct {
	tenant, channel, recipient, category, from, user string
	json, yes                                        bool
}

// newQuotaCmd is `sluice quota show|reset`.
func newQuotaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Show or reset a tenant's send quotas",
		Long: `Show or reset the quota windows of a tenant (tenant-wide rules) and, with
--recipient, of one recipient. Rules come from SLUICE_RULES; recipients are
looked up by SLUICE_SUBJECT_SECRET, which must match the workers'.`,
	}
	cmd.AddCommand(newQuotaShowCmd(), newQuotaResetCmd())
	return cmd
}

// register adds the flags that select quota windows to c.
func (f *quotaFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.tenant, "tenant", "", "tenant id (required)")
	c.Flags().StringVar(&f.channel, "channel", "", "email, sms or whatsapp (default: all)")
	c.Flags().StringVar(&f.recipient, "recipient", "", "also the recipient's rules and quiet hours: an address or E.164 number")
	c.Flags().StringVar(&f.user, "user", "", "also the person's windows (user rules, across channels): the notifications' user id")
	c.Flags().StringVar(&f.category, "category", "", "the category whose rules to show (default: the default category)")
	c.Flags().StringVar(&f.from, "from", "", "the sender of sender rules: a number, an address or a Messaging Service SID (default: SLUICE_SMS_FROM or SLUICE_SMS_MESSAGING_SERVICE_SID / SLUICE_SMTP_FROM)")
}

// newQuotaShowCmd is `sluice quota show`.
func newQuotaShowCmd() *cobra.Command {
	var f quotaFlags
	show := &cobra.Command{
		Use:   "show",
		Short: "Per rule: used, remaining, when the next slot frees",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			env, err := loadQuotaEnv(f)
			if err != nil {
				return err
			}
			rep, err := report.Quotas(cmd.Context(), env.lim, env.policy, env.cfg, f.query())
			if errors.Is(err, report.ErrNoRules) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			waiting, err := tasks.TenantWaiting(cmd.Context(), env.deps.Redis, env.cfg.Layout(), f.tenant, env.policy.Pins())
			if err != nil {
				return err
			}
			dg, err := openDigest(cmd, env, f)
			if err != nil {
				return err
			}
			win, err := serviceWindow(cmd, env, f)
			if err != nil {
				return err
			}
			return printUsage(cmd, rep, roomsOf(f.tenant, waiting, env.policy), dg, win, f.json)
		},
	}
	f.register(show)
	show.Flags().BoolVar(&f.json, "json", false, "print JSON")
	return show
}

// newQuotaResetCmd is `sluice quota reset`.
func newQuotaResetCmd() *cobra.Command {
	var f quotaFlags
	reset := &cobra.Command{
		Use:   "reset",
		Short: "Forget every send in the selected windows (asks first)",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			env, err := loadQuotaEnv(f)
			if err != nil {
				return err
			}
			rep, err := report.Quotas(cmd.Context(), env.lim, env.policy, env.cfg, f.query())
			if errors.Is(err, report.ErrNoRules) || err == nil && len(rep.Rows) == 0 {
				return usageError{fmt.Errorf("no windows to reset: %w", report.ErrNoRules)}
			}
			if err != nil {
				return err
			}
			limits := make([]throttle.Limit, len(rep.Rows))
			for i, r := range rep.Rows {
				limits[i] = r.Limit
			}
			if !f.yes {
				if err := confirmReset(cmd, f, len(limits)); err != nil {
					return err
				}
			}
			if err := env.lim.Reset(cmd.Context(), f.tenant, limits...); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reset %d windows\n", len(limits))
			return nil
		},
	}
	f.register(reset)
	reset.Flags().BoolVar(&f.yes, "yes", false, "do not ask for confirmation")
	return reset
}

// confirmReset asks on the command's input whether to reset n windows, and
// returns an error unless the answer is yes.
func confirmReset(cmd *cobra.Command, f quotaFlags, n int) error {
	fmt.Fprintf(cmd.OutOrStdout(), "Reset %d quota windows of tenant %s", n, f.tenant)
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
	return nil
}

// quotaEnv is what the quota commands need from the environment.
type quotaEnv struct {
	deps   *services.Set
	lim    *throttle.Limiter
	policy plans.Policy
	cfg    config.Base
}

func loadQuotaEnv(f quotaFlags) (*quotaEnv, error) {
	if err := tasks.CheckTenant(f.tenant); err != nil {
		return nil, usageError{fmt.Errorf("--tenant: %w", err)}
	}
	if f.channel != "" {
		if _, err := tasks.Channel(f.channel).TaskType(); err != nil {
			return nil, usageError{fmt.Errorf("--channel: %w", err)}
		}
	}
	d, base, err := openTool(false)
	if err != nil {
		return nil, err
	}
	// The rules in force: SLUICE_RULES with the tenant plans, as workers see them.
	policy, err := d.LoadPlans(context.Background())
	if err != nil && len(policy.Entries()) == 0 {
		d.Close()
		return nil, err
	}
	return &quotaEnv{deps: d, lim: d.Limiter, policy: policy, cfg: base}, nil
}

func (f quotaFlags) query() report.QuotaQuery {
	return report.QuotaQuery{Tenant: f.tenant, Channel: tasks.Channel(f.channel), Category: f.category, Recipient: f.recipient, From: f.from, User: f.user}
}

// rooms is what a tenant has waiting in its rooms, not yet dispatched to
// a worker, by lane, and its weight in the fair dispatch.
type rooms struct {
	Waiting map[string]int64 `json:"waiting"`
	Weight  int              `json:"weight"`
}

func roomsOf(tenant string, waiting map[tasks.Lane]int64, policy plans.Policy) rooms {
	r := rooms{Waiting: map[string]int64{}, Weight: 1}
	for _, lane := range tasks.Lanes {
		r.Waiting[string(lane)] = waiting[lane]
	}
	if w, ok := policy.Weights()[tenant]; ok {
		r.Weight = w
	}
	return r
}

func printUsage(cmd *cobra.Command, rep report.QuotaReport, r rooms, dg *digestShown, win *windowShown, asJSON bool) error {
	out := cmd.OutOrStdout()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			report.QuotaJSON
			rooms
			Digest *digestShown `json:"digest,omitempty"`
			Window *windowShown `json:"service_window,omitempty"`
		}{rep.JSON(), r, dg, win})
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if len(rep.Rows) > 0 {
		fmt.Fprintln(tw, "SCOPE\tRULE\tUSED\tREMAINING\tBOOKED\tNEXT SLOT\tWINDOW EMPTY")
		for _, r := range rep.Rows {
			rule := r.Limit.Rule.String()
			if r.Rule.Drop {
				rule += " drop"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.Limit.Scope, rule, r.Used, r.Remaining, r.Booked,
				inDuration(r.NextFree.Sub(r.Now)), inDuration(r.ResetAt.Sub(r.Now)))
		}
	}
	for _, q := range rep.Quiet {
		state := "open; quiet from"
		if q.Quiet {
			state = "QUIET now; opens"
		}
		fmt.Fprintf(tw, "%s.%s quiet hours %s (%s)\t%s %s\n", q.Channel, q.Category, q.Hours, strings.Join(q.Zones, ", "),
			state, inDuration(time.Until(q.Until)))
	}
	fmt.Fprintf(tw, "waiting in its rooms (not yet dispatched)\tpriority %d, standard %d, bulk %d; weight %d\n",
		r.Waiting["priority"], r.Waiting["standard"], r.Waiting["bulk"], r.Weight)
	if dg != nil {
		state := "none open"
		if dg.Open != nil {
			state = fmt.Sprintf("open: %d of %d items, carried by %s", dg.Open.Items, dg.Max, dg.Open.Carrier)
		}
		fmt.Fprintf(tw, "digest (%s)\t%s\n", dg.Rule, state)
	}
	if win != nil {
		state := "CLOSED: templates only (no message from the recipient in 24 h)"
		if win.Open {
			state = fmt.Sprintf("open to free-form messages; closes %s (its last message %s ago)", inDuration(time.Until(*win.Closes)), time.Since(*win.LastInbound).Round(time.Second))
		}
		fmt.Fprintf(tw, "whatsapp customer-service window\t%s\n", state)
	}
	return tw.Flush()
}

// windowShown is a WhatsApp recipient's customer-service window.
type windowShown struct {
	Open        bool       `json:"open"`
	LastInbound *time.Time `json:"last_inbound,omitempty"`
	Closes      *time.Time `json:"closes,omitempty"`
}

// serviceWindow reads --recipient's WhatsApp customer-service window, for
// --channel whatsapp (or none) with a recipient; nil otherwise.
func serviceWindow(cmd *cobra.Command, env *quotaEnv, f quotaFlags) (*windowShown, error) {
	if f.recipient == "" || (f.channel != "" && f.channel != string(tasks.WhatsApp)) || !tasks.IsE164(tasks.NormalizePhone(f.recipient)) {
		return nil, nil
	}
	w, err := env.deps.Consent.Window(cmd.Context(), f.tenant, tasks.WhatsApp, f.recipient)
	if err != nil {
		return nil, err
	}
	out := &windowShown{Open: w.Open(time.Now())}
	if !w.LastInbound.IsZero() {
		out.LastInbound, out.Closes = &w.LastInbound, &w.Closes
	}
	return out, nil
}

// digestShown is the recipient's digest under the category's digest rule.
type digestShown struct {
	Rule string             `json:"rule"`
	Max  int                `json:"max"`
	Open *digest.OpenDigest `json:"open,omitempty"`
}

// openDigest reads the digest open for --recipient in --channel and
// --category (without a key: one per recipient), when that category is
// digested; nil otherwise.
func openDigest(cmd *cobra.Command, env *quotaEnv, f quotaFlags) (*digestShown, error) {
	if f.recipient == "" || f.channel == "" {
		return nil, nil
	}
	ch := tasks.Channel(f.channel)
	m := env.policy.Match(f.tenant, ch, f.category)
	if m.Digest == nil {
		return nil, nil
	}
	n := tasks.Notification{Tenant: f.tenant, Channel: ch, To: f.recipient, Category: f.category}
	o, err := digest.New(env.deps.Redis, env.lim).OpenFor(cmd.Context(), n, *m.Digest)
	if err != nil {
		return nil, err
	}
	return &digestShown{Rule: "digest=" + m.Digest.String(), Max: m.Digest.Max, Open: o}, nil
}

func inDuration(d time.Duration) string {
	if d <= 0 {
		return "now"
	}
	return "in " + d.Round(100*time.Millisecond).String()
}
