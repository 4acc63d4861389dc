package plans_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// A distinct-count rule reads on a tenant, sender or provider scope and
// counts the notification's recipient; on a recipient or user scope, which
// has one subject, it is refused.
func TestDistinctRules(t *testing.T) {
	p, err := plans.Parse("whatsapp:tenant=250/1d@distinct, whatsapp:recipient=1/6s, whatsapp:sender=80/1s~10")
	if err != nil {
		t.Fatal(err)
	}
	m := p.Match("acme", tasks.WhatsApp, "")
	if len(m.Rates) != 3 {
		t.Fatalf("%d rates, want 3", len(m.Rates))
	}
	l := m.Rates[0].Limit("+14155550100", "106540352242922", "")
	if !l.Rule.Distinct || l.Distinct != "+14155550100" || l.Subject != "" || l.Rule.String() != "250/1d@distinct" {
		t.Fatalf("limit %+v", l)
	}
	if s := m.Rates[2].Limit("+14155550100", "106540352242922", ""); s.Subject != "106540352242922" || s.Group != plans.SharedGroup {
		t.Fatalf("sender limit %+v", s)
	}
	for _, bad := range []string{"whatsapp:recipient=1/1d@distinct", "*:user=3/1d@distinct", "whatsapp:tenant=250/1d~60@distinct", "whatsapp:tenant=250/1d@UTC@distinct"} {
		if _, err := plans.Parse(bad); !errors.Is(err, plans.ErrBadRules) {
			t.Errorf("%q: %v, want ErrBadRules", bad, err)
		}
	}
}
