package dashboard_test

import (
	"context"
	"html"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// The recipient page lists the digest rules of its channel and the digest
// open for the recipient under each: its items so far and its carrier; a
// rule with a key says it has one per key value.
func TestUIRecipientShowsItsDigests(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules+",sms.alerts:digest=max:5,sms.chat:digest=max:9+key:thread", nil)
	lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(b.Config.SubjectSecret), CompactMembers: b.Config.CompactMembers, Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	s := digest.New(b.RDB, lim)
	var carrier string
	for i := range 3 {
		n := tasks.NewSMS("acme", "+14155550100", "alert")
		n.Category = "alerts"
		if i == 0 {
			carrier = n.ID
		}
		if _, err := s.Join(context.Background(), n, plans.Digest{Max: 5}, digest.Item{TaskID: n.ID, Type: tasks.TypeSMS, Payload: []byte("x")}, time.Minute, true); err != nil {
			t.Fatal(err)
		}
	}
	br := newBrowser(t, b.HTTP.URL)
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	csrf := br.csrf("/ui/tenants/acme")
	p := br.do("POST", "/ui/tenants/acme/recipient", url.Values{"csrf": {csrf}, "recipient": {"+14155550100"}})
	body := html.UnescapeString(p.body)
	if p.status != 200 || !strings.Contains(body, `<li data-digest="alerts"><strong>alerts</strong> (digest=max:5):`) ||
		!strings.Contains(body, `open, <span class="items">3</span> of 5 items, carried by `+carrier) ||
		!strings.Contains(body, "one per thread (not listed here)") {
		t.Fatalf("recipient page: %d %s", p.status, body)
	}
	// Another recipient: no digest open.
	p = br.do("POST", "/ui/tenants/acme/recipient", url.Values{"csrf": {csrf}, "recipient": {"+14155550111"}})
	if body := html.UnescapeString(p.body); p.status != 200 || !strings.Contains(body, "(digest=max:5):\n    none open") {
		t.Fatalf("another recipient: %d %s", p.status, body)
	}
}
