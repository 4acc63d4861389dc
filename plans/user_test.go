package plans_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// A user rule on every channel ('*') is one window per person: the email
// and the SMS of a category bind the same limiter scope and subject, the
// person's id; a notification that names no person is not counted.
func TestUserRulesSpanChannels(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "*.marketing:user=3/1d, email:user=10/1h, sms:recipient=1/1m")
	if got := p.String(); !strings.Contains(got, "*.marketing:user=3/1d") {
		t.Fatalf("String() = %q, want the user rule as written", got)
	}
	bound := func(ch tasks.Channel, category, user string) map[string]string {
		n := tasks.Notification{Tenant: "acme", Channel: ch, To: "x", Category: category, User: user}
		pl := plans.Planner{}.Check(p, n, "", time.Now())
		if len(pl.Limits) != len(pl.Match.Rates) {
			t.Fatalf("%s %s: %d limits for %d rates", ch, category, len(pl.Limits), len(pl.Match.Rates))
		}
		out := map[string]string{}
		for i, l := range pl.Limits {
			if l.Group != "" {
				t.Errorf("%s: a user window lives in group %q, want the tenant's", pl.Match.Rates[i], l.Group)
			}
			out[l.Scope] = l.Subject
		}
		return out
	}
	email, sms := bound(tasks.Email, "marketing", "u-42"), bound(tasks.SMS, "marketing", "u-42")
	if email["all.marketing:user"] != "u-42" || sms["all.marketing:user"] != "u-42" {
		t.Errorf("the cross-channel rule binds email %v, sms %v; want scope all.marketing:user, subject u-42 on both", email, sms)
	}
	if email["email:user"] != "u-42" {
		t.Errorf("email's own user rule: %v", email)
	}
	if _, ok := sms["email:user"]; ok {
		t.Errorf("an email user rule binds an SMS: %v", sms)
	}
	if got := bound(tasks.SMS, "otp", "u-42"); got["all.marketing:user"] != "" {
		t.Errorf("a marketing rule binds an otp SMS: %v", got)
	}
	if got := bound(tasks.SMS, "marketing", ""); len(got) != 1 || got["sms:recipient"] != "x" {
		t.Errorf("no user: limits %v, want the recipient rule alone", got)
	}
	// A tenant's plan replaces the default of the same target.
	q, err := p.With("acme", mustParse(t, "*.marketing:user=1/1d"))
	if err != nil {
		t.Fatal(err)
	}
	if got := rates(q.Match("acme", tasks.Email, "marketing")); strings.Contains(strings.Join(got, ","), "user=3/1d") {
		t.Errorf("acme's plan did not replace the default user rule: %v", got)
	}
}

func TestUserRuleErrors(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{
		"*:recipient=1/1m":       "'*' (every channel) is for person caps",
		"*.marketing:quiet=21-8": "'*' (every channel) is for person caps",
		"*:user:concurrency=2":   "'*' (every channel) is for person caps",
		"*:user":                 "want user=LIMIT/WINDOW",
		"*.marketing:user=3/1d,*.marketing:user=3/1d": "repeats",
		"fax:user=1/1d": `unknown channel "fax"`,
	} {
		_, err := plans.Parse(s)
		if !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want ErrBadRules mentioning %q", s, err, want)
		}
	}
}
