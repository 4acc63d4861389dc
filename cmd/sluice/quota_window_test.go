package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// quota show prints a WhatsApp recipient's customer-service window, closed
// until the recipient writes, and a distinct rule's count of recipients.
func TestQuotaShowServiceWindow(t *testing.T) {
	srv := env(t)
	t.Setenv("SLUICE_RULES", "whatsapp:tenant=250/1d@distinct")
	show := func(args ...string) result {
		t.Helper()
		r := sluice(t, "", append([]string{"quota", "show", "--tenant", "acme", "--channel", "whatsapp", "--recipient", "+14155550100"}, args...)...)
		if r.code != 0 {
			t.Fatalf("show: %+v", r)
		}
		return r
	}
	if r := show(); !regexp.MustCompile(`whatsapp customer-service window\s+CLOSED`).MatchString(r.stdout) || !strings.Contains(r.stdout, "250/1d@distinct") {
		t.Fatalf("before an inbound message:\n%s", r.stdout)
	}
	lim, _ := throttle.New(srv.Client(t), throttle.Options{Secret: []byte(testSecret)})
	cs, err := consent.NewStore(srv.Client(t), lim, consent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wrote := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	if err := cs.RecordInbound(context.Background(), "acme", tasks.WhatsApp, "+14155550100", wrote); err != nil {
		t.Fatal(err)
	}
	if r := show(); !regexp.MustCompile(`whatsapp customer-service window\s+open to free-form messages; closes in 2[23]h\d+m[\d.]+s \(its last message 1h0m0s ago\)`).MatchString(r.stdout) {
		t.Fatalf("after an inbound message:\n%s", r.stdout)
	}
	var out struct {
		Window struct {
			Open        bool      `json:"open"`
			LastInbound time.Time `json:"last_inbound"`
			Closes      time.Time `json:"closes"`
		} `json:"service_window"`
	}
	if err := json.Unmarshal([]byte(show("--json").stdout), &out); err != nil {
		t.Fatal(err)
	}
	if w := out.Window; !w.Open || !w.LastInbound.Equal(wrote) || !w.Closes.Equal(wrote.Add(24*time.Hour)) {
		t.Fatalf("json window %+v, want open from %v", w, wrote)
	}
}
