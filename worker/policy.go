package worker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// ErrBadRules reports a SLUICE_RULES value that does not parse.
var ErrBadRules = errors.New("bad rules")

// Scopes a rule can apply to.
const (
	ScopeRecipient = "recipient"
	ScopeTenant    = "tenant"
)

// RuleSpec is one entry of the rule grammar: [TENANT/]CHANNEL:SCOPE=LIMIT/WINDOW.
type RuleSpec struct {
	Tenant  string // empty for a default rule
	Channel tasks.Channel
	Scope   string // recipient or tenant
	Rule    throttle.Rule
}

// String prints the spec in the grammar ParsePolicy reads.
func (s RuleSpec) String() string {
	p := ""
	if s.Tenant != "" {
		p = s.Tenant + "/"
	}
	return p + string(s.Channel) + ":" + s.Scope + "=" + s.Rule.String()
}

// Policy maps a notification to the limits that apply to it.
type Policy struct {
	defaults  []RuleSpec
	overrides map[string][]RuleSpec // by tenant
}

// ParsePolicy reads comma-separated rule specs, e.g.
// "sms:recipient=1/1m,sms:recipient=5/1d,acme/sms:tenant=5000/1h".
func ParsePolicy(s string) (Policy, error) {
	p := Policy{overrides: map[string][]RuleSpec{}}
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		spec, err := parseSpec(part)
		if err != nil {
			return Policy{}, fmt.Errorf("%w: entry %d %q: %w", ErrBadRules, i+1, part, err)
		}
		id := fmt.Sprintf("%s/%s:%s:%d", spec.Tenant, spec.Channel, spec.Scope, spec.Rule.Window)
		if seen[id] {
			return Policy{}, fmt.Errorf("%w: entry %d %q: a rule with this tenant, channel, scope and window is already given", ErrBadRules, i+1, part)
		}
		seen[id] = true
		if spec.Tenant == "" {
			p.defaults = append(p.defaults, spec)
		} else {
			p.overrides[spec.Tenant] = append(p.overrides[spec.Tenant], spec)
		}
	}
	for tenant := range p.overrides {
		for _, ch := range []tasks.Channel{tasks.Email, tasks.SMS} {
			if n := len(p.specs(tenant, ch)); n > throttle.MaxRules {
				return Policy{}, fmt.Errorf("%w: %d rules apply to %s %s, at most %d", ErrBadRules, n, tenant, ch, throttle.MaxRules)
			}
		}
	}
	for _, ch := range []tasks.Channel{tasks.Email, tasks.SMS} {
		if n := len(p.specs("", ch)); n > throttle.MaxRules {
			return Policy{}, fmt.Errorf("%w: %d rules apply to %s, at most %d", ErrBadRules, n, ch, throttle.MaxRules)
		}
	}
	return p, nil
}

func parseSpec(s string) (RuleSpec, error) {
	var spec RuleSpec
	lhs, rhs, ok := strings.Cut(s, "=")
	if !ok {
		return spec, errors.New("want [TENANT/]CHANNEL:SCOPE=LIMIT/WINDOW")
	}
	if t, rest, ok := strings.Cut(lhs, "/"); ok {
		if err := tasks.CheckTenant(t); err != nil {
			return spec, err
		}
		spec.Tenant, lhs = t, rest
	}
	ch, scope, ok := strings.Cut(strings.TrimSpace(lhs), ":")
	if !ok {
		return spec, errors.New("want CHANNEL:SCOPE before '=', e.g. sms:recipient")
	}
	spec.Channel = tasks.Channel(ch)
	if _, err := spec.Channel.TaskType(); err != nil {
		return spec, err
	}
	if scope != ScopeRecipient && scope != ScopeTenant {
		return spec, fmt.Errorf("scope %q: want recipient or tenant", scope)
	}
	spec.Scope = scope
	r, err := throttle.ParseRule(rhs)
	if err != nil {
		return spec, err
	}
	spec.Rule = r
	return spec, nil
}

// specs returns the rules for a tenant and channel: the defaults, with the
// tenant's overrides replacing those of the same scope and window.
func (p Policy) specs(tenant string, ch tasks.Channel) []RuleSpec {
	var out []RuleSpec
	over := p.overrides[tenant]
	for _, d := range p.defaults {
		if d.Channel != ch {
			continue
		}
		replaced := false
		for _, o := range over {
			if o.Channel == ch && o.Scope == d.Scope && o.Rule.Window == d.Rule.Window {
				replaced = true
			}
		}
		if !replaced {
			out = append(out, d)
		}
	}
	for _, o := range over {
		if o.Channel == ch {
			out = append(out, o)
		}
	}
	return out
}

// Specs returns the rules that apply to a tenant's notifications on a channel.
func (p Policy) Specs(tenant string, ch tasks.Channel) []RuleSpec { return p.specs(tenant, ch) }

// Limits returns the limiter limits for a (normalised) notification.
func (p Policy) Limits(n tasks.Notification) []throttle.Limit {
	specs := p.specs(n.Tenant, n.Channel)
	out := make([]throttle.Limit, 0, len(specs))
	for _, s := range specs {
		out = append(out, s.Limit(n.To))
	}
	return out
}

// Limit binds the spec to a recipient (ignored for tenant-scope rules).
func (s RuleSpec) Limit(recipient string) throttle.Limit {
	l := throttle.Limit{Scope: string(s.Channel) + ":" + s.Scope, Rule: s.Rule}
	if s.Scope == ScopeRecipient {
		l.Subject = recipient
	}
	return l
}

// All returns every spec, defaults first.
func (p Policy) All() []RuleSpec {
	out := append([]RuleSpec(nil), p.defaults...)
	for _, o := range p.overrides {
		out = append(out, o...)
	}
	return out
}
