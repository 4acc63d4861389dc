package plans_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// Plans are versioned, logged with their author, validated against the
// defaults, and merged over them; deleting one gives the defaults back.
func TestStore(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	st := plans.NewStore(rdb, mustParse(t, "sms:tenant=1000/1h,sms:recipient=1/1m"))
	p1, err := st.Set(ctx, "acme", "sms:tenant=10/1h, sms.otp:exempt", "ann@ops")
	if err != nil || p1.Version != 1 || p1.Rules != "sms:tenant=10/1h,sms.otp:exempt" || p1.By != "ann@ops" {
		t.Fatalf("set: %+v %v", p1, err)
	}
	if _, err := st.Set(ctx, "beta", "sms:tenant=5/1h", "bob"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"sms:tenant=0/1h", "other/sms:tenant=1/1h", "sms:provider=1/1s"} {
		if _, err := st.Set(ctx, "acme", bad, "x"); !errors.Is(err, plans.ErrBadRules) {
			t.Errorf("Set(%q) = %v", bad, err)
		}
	}
	snap, err := st.Load(ctx)
	if err != nil || snap.Version != 2 || len(snap.Plans) != 2 {
		t.Fatalf("load: %+v %v", snap, err)
	}
	if got := rates(snap.Policy.Match("acme", tasks.SMS, "")); len(got) != 2 || got[1] != "acme/sms:tenant=10/1h" {
		t.Fatalf("acme in force: %v", got)
	}
	if got := rates(snap.Policy.Match("gamma", tasks.SMS, "")); len(got) != 2 || got[0] != "sms:tenant=1000/1h" {
		t.Fatalf("a tenant without a plan: %v", got)
	}
	if _, err := st.Delete(ctx, "acme", "ann@ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "acme"); !errors.Is(err, plans.ErrNoPlan) {
		t.Fatalf("after delete: %v", err)
	}
	hist, _ := st.History(ctx, 10)
	if len(hist) != 3 || hist[0].Action != "delete" || hist[0].Version != 3 || hist[2].By != "ann@ops" || hist[2].Rules == "" {
		t.Fatalf("history %+v", hist)
	}
}

// Concurrent changes each get their own version, and the last one's plan
// is what a load returns with the last version.
func TestStoreConcurrentChanges(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	st := plans.NewStore(rdb, plans.Policy{})
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := st.Set(ctx, "acme", "sms:tenant=1/1h", "w"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	snap, _ := st.Load(ctx)
	p, _ := st.Get(ctx, "acme")
	if snap.Version != 20 || p.Version != 20 {
		t.Fatalf("version %d, plan version %d; want 20 and 20", snap.Version, p.Version)
	}
}

// A watcher applies a change when the pub/sub message comes, and — the
// message lost — at its next version check.
func TestWatcher(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := plans.NewStore(rdb, mustParse(t, "sms:tenant=1000/1h"))
	got := make(chan plans.Snapshot, 4)
	w, err := st.Watch(ctx, time.Hour, discard, func(_, cur plans.Snapshot, changes []plans.Change) {
		if len(changes) == 0 {
			t.Error("a reload without its changes")
		}
		got <- cur
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := st.Set(ctx, "acme", "sms:tenant=7/1h", "t"); err != nil {
		t.Fatal(err)
	}
	select {
	case snap := <-got:
		if snap.Version != 1 || w.Current().Version != 1 {
			t.Fatalf("snapshot %+v", snap)
		}
		t.Logf("applied %v after the change (pub/sub)", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the pub/sub change did not reach the watcher")
	}

	// Without a message: a second watcher checks the version every 100 ms.
	w2, err := st.Watch(ctx, 100*time.Millisecond, discard, func(_, cur plans.Snapshot, _ []plans.Change) { got <- cur })
	if err != nil {
		t.Fatal(err)
	}
	rdb.Incr(ctx, "sluice:{plans}:version") // a change whose message was lost
	deadline := time.After(5 * time.Second)
	for w2.Current().Version != 2 {
		select {
		case <-got:
		case <-deadline:
			t.Fatalf("the version check did not catch a change without a message: version %d", w2.Current().Version)
		}
	}
}
