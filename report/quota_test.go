package report_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/report"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// The quota report's quiet hours name the zones the worker checks against:
// both plan with one plans.Planner, so a recipient whose zone nothing tells
// falls back to SLUICE_DEFAULT_TZ in both (the report used to fall back to
// UTC), and a tenant's tz= rule wins over it in both.
func TestQuietZonesAreTheWorkers(t *testing.T) {
	_, rdb := redistest.New(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("test-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	policy, err := plans.Parse("email:recipient=10/1m,email:quiet=22:00-08:00,globex/tz=Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	base := config.Base{DefaultTZ: "Asia/Tokyo", SMTPFrom: "sluice@example.com", SendSlack: 100 * time.Millisecond}
	for tenant, want := range map[string]string{"acme": "Asia/Tokyo", "globex": "Europe/Berlin"} {
		rep, err := report.Quotas(context.Background(), lim, policy, base, report.QuotaQuery{Tenant: tenant, Channel: tasks.Email, Recipient: "ada@example.com"})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Quiet) != 1 {
			t.Fatalf("%s: %d quiet rows, want 1", tenant, len(rep.Quiet))
		}
		n := tasks.Notification{Tenant: tenant, Channel: tasks.Email, To: "ada@example.com"}.Normalized()
		var worker []string
		for _, z := range base.Planner().Check(policy, n, base.Origin(n), time.Now()).Zones {
			worker = append(worker, z.String())
		}
		if got := rep.Quiet[0].Zones; !slices.Equal(got, []string{want}) || !slices.Equal(got, worker) {
			t.Errorf("%s: report's quiet zones %v, worker's %v; want both [%s]", tenant, got, worker, want)
		}
	}
}
