package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// newTenantCmd is `sluice tenant set|show|list|delete|history|token`.
func newTenantCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Manage tenant plans: rules that change while workers run",
		Long: `A tenant plan is a list of rules (the SLUICE_RULES grammar, without TENANT/
prefixes) that applies to one tenant, replacing the default entries with the
same target. Plans live in Redis; running workers apply a change within
SLUICE_PLAN_CHECK_INTERVAL (1 s) without a restart. Tenants without a plan get
SLUICE_RULES. Every change is versioned and logged with who made it.`,
	}
	cmd.AddCommand(newTenantSetCmd(), newTenantShowCmd(), newTenantListCmd(), newTenantDeleteCmd(),
		newTenantHistoryCmd(), newTenantTokenCmd())
	return cmd
}

// newTenantSetCmd is `sluice tenant set TENANT`.
func newTenantSetCmd() *cobra.Command {
	var rules, tz, quiet, by string
	set := &cobra.Command{
		Use:   "set TENANT",
		Short: "Store a tenant's plan (replaces the one it had)",
		Example: `  sluice tenant set acme --rules 'sms:tenant=10000/1h,sms.marketing:recipient=3/1d' --tz America/New_York
  sluice tenant set acme --rules 'sms:tenant=1000/1h' --quiet-hours 21:00-08:00`,
		Args: argsError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant := args[0]
			text := planText(rules, tz, quiet)
			if strings.Trim(text, ", ") == "" {
				return usageError{errors.New("give the plan's --rules (and/or --tz, --quiet-hours)")}
			}
			st, rdb, err := planStore()
			if err != nil {
				return err
			}
			defer rdb.Close()
			if _, err := st.Check(tenant, text); err != nil {
				return usageError{err}
			}
			p, err := st.Set(cmd.Context(), tenant, text, who(by))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tenant %s: plan version %d set by %s at %s\n  rules: %s\n", p.Tenant, p.Version, p.By,
				p.UpdatedAt.Format("2006-01-02 15:04:05Z07:00"), p.Rules)
			return nil
		},
	}
	set.Flags().StringVar(&rules, "rules", "", "the plan's rules, e.g. 'sms:tenant=10000/1h,sms.otp:exempt'")
	set.Flags().StringVar(&tz, "tz", "", "the tenant's default time zone for quiet hours (IANA, e.g. Europe/Berlin)")
	set.Flags().StringVar(&quiet, "quiet-hours", "", "quiet hours on both channels, e.g. 21:00-08:00")
	set.Flags().StringVar(&by, "by", "", "who makes the change, for the log (default: user@host)")
	return set
}

// planText is the rules text of set's flags: --rules, then the time zone
// of --tz and the quiet hours of --quiet-hours on both channels.
func planText(rules, tz, quiet string) string {
	text := rules
	if tz != "" {
		text += ",tz=" + tz
	}
	if quiet != "" {
		text += ",sms:quiet=" + quiet + ",email:quiet=" + quiet
	}
	return text
}

// newTenantShowCmd is `sluice tenant show TENANT`.
func newTenantShowCmd() *cobra.Command {
	var asJSON bool
	show := &cobra.Command{
		Use:   "show TENANT",
		Short: "Print a tenant's plan and the rules in force for it",
		Args:  argsError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant := args[0]
			if err := tasks.CheckTenant(tenant); err != nil {
				return usageError{err}
			}
			st, rdb, err := planStore()
			if err != nil {
				return err
			}
			defer rdb.Close()
			p, err := st.Get(cmd.Context(), tenant)
			own := err == nil
			if err != nil && !errors.Is(err, plans.ErrNoPlan) {
				return err
			}
			snap, err := st.Load(cmd.Context())
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "sluice: warning:", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"plan": planOrNil(own, p), "in_force": inForce(snap.Policy, tenant)})
			}
			printTenantPlan(out, tenant, own, p, snap.Policy)
			return nil
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return show
}

// printTenantPlan writes show's text: the tenant's own plan if it has one
// (own), then the rules in force for it under policy.
func printTenantPlan(out io.Writer, tenant string, own bool, p plans.Plan, policy plans.Policy) {
	if own {
		fmt.Fprintf(out, "tenant %s: plan version %d, set by %s at %s\n  rules: %s\n", tenant, p.Version, p.By, p.UpdatedAt.Format("2006-01-02 15:04:05Z07:00"), p.Rules)
	} else {
		fmt.Fprintf(out, "tenant %s has no plan: the defaults (SLUICE_RULES) apply\n", tenant)
	}
	fmt.Fprintln(out, "in force (default category):")
	for ch, rs := range inForce(policy, tenant) {
		fmt.Fprintf(out, "  %s: %s\n", ch, strings.Join(rs, ", "))
	}
}

// newTenantListCmd is `sluice tenant list`.
func newTenantListCmd() *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenants that have a plan",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, rdb, err := planStore()
			if err != nil {
				return err
			}
			defer rdb.Close()
			snap, err := st.Load(cmd.Context())
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "sluice: warning:", err)
			}
			if asJSON {
				if snap.Plans == nil {
					snap.Plans = []plans.Plan{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"version": snap.Version, "plans": snap.Plans})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "TENANT\tVERSION\tBY\tUPDATED\tRULES\n")
			for _, p := range snap.Plans {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", p.Tenant, p.Version, p.By, p.UpdatedAt.Format("2006-01-02 15:04:05Z07:00"), p.Rules)
			}
			fmt.Fprintf(tw, "(plans version %d)\n", snap.Version)
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// newTenantDeleteCmd is `sluice tenant delete TENANT`.
func newTenantDeleteCmd() *cobra.Command {
	var by string
	var yes bool
	del := &cobra.Command{
		Use:   "delete TENANT",
		Short: "Delete a tenant's plan: the defaults apply to it again (asks first)",
		Args:  argsError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant := args[0]
			if err := tasks.CheckTenant(tenant); err != nil {
				return usageError{err}
			}
			if !yes {
				fmt.Fprintf(cmd.OutOrStdout(), "Delete the plan of tenant %s? The defaults will apply to it. [y/N] ", tenant)
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					return errors.New("not confirmed; nothing deleted (use --yes to skip the question)")
				}
			}
			st, rdb, err := planStore()
			if err != nil {
				return err
			}
			defer rdb.Close()
			p, err := st.Delete(cmd.Context(), tenant, who(by))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tenant %s: plan deleted (version %d) by %s; the defaults apply\n", tenant, p.Version, p.By)
			return nil
		},
	}
	del.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	del.Flags().StringVar(&by, "by", "", "who makes the change, for the log (default: user@host)")
	return del
}

// newTenantHistoryCmd is `sluice tenant history`.
func newTenantHistoryCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "history",
		Short: "The latest plan changes: version, tenant, who, when, what",
		Args:  argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, rdb, err := planStore()
			if err != nil {
				return err
			}
			defer rdb.Close()
			cs, err := st.History(cmd.Context(), 50)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "VERSION\tTENANT\tACTION\tBY\tAT\tRULES\n")
			for _, c := range cs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", c.Version, c.Tenant, c.Action, c.By, c.At.Format("2006-01-02 15:04:05Z07:00"), c.Rules)
			}
			return tw.Flush()
		},
	}
}

// planStore opens the plan store of the environment's Redis, with SLUICE_RULES as defaults.
func planStore() (*plans.Store, redis.UniversalClient, error) {
	cfg, err := readBase()
	if err != nil {
		return nil, nil, err
	}
	defaults, err := plans.Parse(cfg.Rules)
	if err != nil {
		return nil, nil, fmt.Errorf("SLUICE_RULES: %w", err)
	}
	rdb, err := cfg.NewRedisClient()
	if err != nil {
		return nil, nil, err
	}
	return plans.NewStore(rdb, defaults), rdb, nil
}

// who names the author of a change: --by, else user@host.
func who(by string) string {
	if by != "" {
		return by
	}
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func planOrNil(own bool, p plans.Plan) any {
	if !own {
		return nil
	}
	return p
}

// inForce lists, per channel, the rate rules a tenant's default-category sends face.
func inForce(p plans.Policy, tenant string) map[string][]string {
	out := map[string][]string{}
	for _, ch := range []tasks.Channel{tasks.Email, tasks.SMS} {
		m := p.Match(tenant, ch, "")
		rs := []string{}
		for _, e := range m.Rates {
			rs = append(rs, e.String())
		}
		if m.Quiet != nil {
			rs = append(rs, "quiet "+m.Quiet.String())
		}
		out[string(ch)] = rs
	}
	return out
}
