package plans_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

func TestDigestRule(t *testing.T) {
	p, err := plans.Parse("email:recipient=1/1m,email.comment:digest=max:50,acme/email.comment:digest=max:10+window:30s+key:thread,sms.otp:exempt,sms:digest=max:5")
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Match("globex", tasks.Email, "comment").Digest; d == nil || d.Max != 50 || d.Window != 0 || d.Key != "" {
		t.Errorf("globex's comments: %+v", d)
	}
	d := p.Match("acme", tasks.Email, "comment").Digest
	if d == nil || d.Max != 10 || d.Window != 30*time.Second || d.Key != "thread" {
		t.Fatalf("acme's comments: %+v", d)
	}
	n := tasks.NewEmail("acme", "a@example.com", "s", "b")
	n.Metadata = map[string]string{"thread": "t-42"}
	if g := d.GroupOf(n); g != "t-42" {
		t.Errorf("group %q, want the thread", g)
	}
	if d := p.Match("acme", tasks.Email, "billing").Digest; d != nil {
		t.Errorf("billing is not digested: %+v", d)
	}
	if d := p.Match("acme", tasks.SMS, "otp").Digest; d != nil {
		t.Errorf("an exempt category is never digested: %+v", d)
	}
	if d := p.Match("acme", tasks.SMS, "alerts").Digest; d == nil || d.Max != 5 {
		t.Errorf("a channel's digest rule covers its categories: %+v", d)
	}
	// Printed as read, and read back the same.
	if s := p.String(); !strings.Contains(s, "acme/email.comment:digest=max:10+window:30s+key:thread") {
		t.Errorf("printed %q", s)
	}
	again, err := plans.Parse(p.String())
	if err != nil || again.String() != p.String() {
		t.Errorf("round trip: %v, %q", err, again.String())
	}
	for _, bad := range []string{
		"email:digest", "email:digest=", "email:digest=max:1", "email:digest=max:1001", "email:digest=max:x",
		"email:digest=window:30s", "email:digest=max:5+max:6", "email:digest=max:5+window:0s", "email:digest=max:5+window:2d",
		"email:digest=max:5+key:", "email:digest=max:5+key:a b", "email:digest=max:5+size:3", "email:digest=max",
	} {
		if _, err := plans.Parse(bad); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), "digest") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestUserRequired(t *testing.T) {
	p, err := plans.Parse("*.marketing:user=3/1d,*.marketing:user=required,acme/email:user=required")
	if err != nil {
		t.Fatal(err)
	}
	n := tasks.NewSMS("globex", "+14155550100", "Sale")
	n.Category = "marketing"
	m := p.Match("globex", tasks.SMS, "marketing")
	if err := m.CheckUser(n); !errors.Is(err, plans.ErrUserRequired) || !strings.Contains(err.Error(), "user") {
		t.Errorf("marketing without user: %v", err)
	}
	if len(m.Rates) != 1 {
		t.Errorf("user=required is not a rate: %v", m.Rates)
	}
	n.User = "u-1"
	if err := m.CheckUser(n); err != nil {
		t.Errorf("with user: %v", err)
	}
	e := tasks.NewEmail("acme", "a@example.com", "s", "b")
	if err := p.Match("acme", tasks.Email, "receipts").CheckNotification(e); !errors.Is(err, plans.ErrUserRequired) {
		t.Errorf("acme's email: %v", err)
	}
	if err := p.Match("globex", tasks.Email, "receipts").CheckNotification(e); err != nil {
		t.Errorf("globex's receipts: %v", err)
	}
	if s := p.String(); !strings.Contains(s, "*.marketing:user=required") || !strings.Contains(s, "acme/email:user=required") {
		t.Errorf("printed %q", s)
	}
}
