package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

func queuedSMS(tenant string, i int) tasks.Notification {
	n := tasks.NewSMS(tenant, fmt.Sprintf("+1415555%04d", i), "queued")
	n.ID = tasks.NewID()
	return n
}

// Past the notification cap a request enters nothing (all or none);
// another tenant is untouched; a retry of the same ids counts once;
// Release frees room.
func TestQueueQuotaCapsAllOrNothing(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	q := tasks.NewQueueQuota(rdb, tasks.Caps{Notifications: 10, TTL: time.Hour})
	var first []tasks.Notification
	for i := range 8 {
		first = append(first, queuedSMS("acme", i))
	}
	if err := q.Reserve(ctx, first...); err != nil {
		t.Fatal(err)
	}
	if err := q.Reserve(ctx, first...); err != nil { // a retry: same ids
		t.Fatalf("retry of the same ids: %v", err)
	}
	more := []tasks.Notification{queuedSMS("acme", 8), queuedSMS("acme", 9), queuedSMS("acme", 10)}
	err := q.Reserve(ctx, more...)
	var full *tasks.QueueFullError
	if !errors.As(err, &full) || !errors.Is(err, tasks.ErrQueueFull) || full.Cap != "notifications" || full.Used != 8 || full.Want != 3 {
		t.Fatalf("3 more over a cap of 10 with 8 queued: %v (%+v)", err, full)
	}
	if u, err := q.Usage(ctx, "acme"); err != nil || u.Notifications != 8 {
		t.Fatalf("usage after a refusal: %+v %v, want 8 (nothing partial)", u, err)
	}
	if err := q.Reserve(ctx, queuedSMS("globex", 0)); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	if n, err := q.Release(ctx, "acme", first[0].ID, first[0].ID, "unknown"); err != nil || n != 1 {
		t.Fatalf("release: %d %v, want 1", n, err)
	}
	if err := q.Reserve(ctx, more[:2]...); err != nil {
		t.Fatalf("after a release 2 fit: %v", err)
	}
	u, err := q.Usage(ctx, "acme")
	if err != nil || u.Notifications != 9 || u.Bytes != 9*tasks.StoredBytes(first[0]) {
		t.Fatalf("usage: %+v %v, want 9 notifications of %d B", u, err, tasks.StoredBytes(first[0]))
	}
}

// The byte cap refuses a request whose bytes do not fit.
func TestQueueQuotaBytes(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	one := tasks.StoredBytes(queuedSMS("acme", 0))
	q := tasks.NewQueueQuota(rdb, tasks.Caps{Bytes: 3 * one, TTL: time.Hour})
	if err := q.Reserve(ctx, queuedSMS("acme", 0), queuedSMS("acme", 1), queuedSMS("acme", 2)); err != nil {
		t.Fatal(err)
	}
	var full *tasks.QueueFullError
	if err := q.Reserve(ctx, queuedSMS("acme", 3)); !errors.As(err, &full) || full.Cap != "bytes" || full.Used != 3*one {
		t.Fatalf("a 4th over a 3-notification byte cap: %v", err)
	}
}

// Under concurrent producers the cap holds exactly.
func TestQueueQuotaConcurrent(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	q := tasks.NewQueueQuota(rdb, tasks.Caps{Notifications: 100, TTL: time.Hour})
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ns []tasks.Notification
			for i := range 7 {
				ns = append(ns, queuedSMS("acme", g*10+i))
			}
			switch err := q.Reserve(ctx, ns...); {
			case err == nil:
				ok.Add(7)
			case errors.Is(err, tasks.ErrQueueFull):
				refused.Add(7)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	u, err := q.Usage(ctx, "acme")
	if err != nil || u.Notifications != ok.Load() || ok.Load() != 98 {
		t.Fatalf("entered %d (usage %+v, %v), want 14 whole requests of 7 = 98 of a cap of 100", ok.Load(), u, err)
	}
}

// An entry whose removal was lost (a crashed worker) lapses after the TTL:
// counts cannot drift up for ever.
func TestQueueQuotaLapses(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	q := tasks.NewQueueQuota(rdb, tasks.Caps{Notifications: 1, TTL: 300 * time.Millisecond})
	if err := q.Reserve(ctx, queuedSMS("acme", 0)); err != nil {
		t.Fatal(err)
	}
	if err := q.Reserve(ctx, queuedSMS("acme", 1)); !errors.Is(err, tasks.ErrQueueFull) {
		t.Fatalf("at the cap: %v", err)
	}
	// Waiting for the TTL itself to pass.
	sluicetest.EventuallyValueEvery(t, 5*time.Second, 50*time.Millisecond, "the entry to lapse (no notifications, no bytes)", func() (tasks.QueuedUsage, bool) {
		u, err := q.Usage(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return u, u.Notifications == 0 && u.Bytes == 0
	})
	if err := q.Reserve(ctx, queuedSMS("acme", 1)); err != nil {
		t.Fatalf("after the lapse: %v", err)
	}
}

// QueueQuota.Enqueue refuses past the cap with nothing in Asynq, and
// takes a failed enqueue out of the count.
func TestQueueQuotaEnqueue(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	q := tasks.NewQueueQuota(rdb, tasks.Caps{Notifications: 2, TTL: time.Hour})
	for i := range 2 {
		if _, err := q.Enqueue(ctx, client, nil, queuedSMS("acme", i), asynq.Queue(holdQueue)); err != nil {
			t.Fatal(err)
		}
	}
	bad := queuedSMS("acme", 2)
	if _, err := q.Enqueue(ctx, client, nil, bad, asynq.Queue(holdQueue)); !errors.Is(err, tasks.ErrQueueFull) {
		t.Fatalf("3rd: %v", err)
	}
	if qi, err := insp.GetQueueInfo(holdQueue); err != nil || qi.Size != 2 {
		t.Fatalf("queue holds %v (%v), want 2", qi, err)
	}
	q2 := tasks.NewQueueQuota(rdb, tasks.Caps{Notifications: 10, TTL: time.Hour})
	bad.To = "" // invalid: Enqueue fails after the reservation
	if _, err := q2.Enqueue(ctx, client, nil, bad, asynq.Queue(holdQueue)); err == nil {
		t.Fatal("an invalid notification was enqueued")
	}
	if u, _ := q2.Usage(ctx, "acme"); u.Notifications != 2 {
		t.Fatalf("a failed enqueue still counts: %+v", u)
	}
}

// ReserveTenants enters several tenants' notifications in one round trip,
// all or none: when one tenant is past its cap, the others' entries are
// taken out again and its *QueueFullError returned; a retry of entered ids
// counts them once; on a fresh server (the script not yet loaded) it works
// the first time.
func TestQueueQuotaReserveTenants(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	q := tasks.NewQueueQuota(rdb, tasks.Caps{Notifications: 3, TTL: time.Hour})
	group := func(tenant string, from, n int) []tasks.Notification {
		var out []tasks.Notification
		for i := range n {
			out = append(out, queuedSMS(tenant, from+i))
		}
		return out
	}
	usage := func(tenant string) int64 {
		t.Helper()
		u, err := q.Usage(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		return u.Notifications
	}
	acme, globex := group("acme", 0, 2), group("globex", 0, 3)
	if err := q.ReserveTenants(ctx, acme, globex); err != nil {
		t.Fatalf("two tenants within their caps: %v", err)
	}
	if err := q.ReserveTenants(ctx, acme, globex); err != nil { // a retry: same ids
		t.Fatalf("a retry of the same ids: %v", err)
	}
	if a, g := usage("acme"), usage("globex"); a != 2 || g != 3 {
		t.Fatalf("usage acme %d, globex %d; want 2 and 3", a, g)
	}
	initech, more := group("initech", 0, 2), group("globex", 10, 1)
	err := q.ReserveTenants(ctx, initech, more)
	var full *tasks.QueueFullError
	if !errors.As(err, &full) || full.Tenant != "globex" || full.Used != 3 || full.Want != 1 {
		t.Fatalf("globex one over its cap of 3: %v (%+v)", err, full)
	}
	if i, g := usage("initech"), usage("globex"); i != 0 || g != 3 {
		t.Fatalf("after the refusal: initech %d, globex %d; want 0 (taken out again) and 3 (its own untouched)", i, g)
	}
}

// A batch larger than the script's chunk of 1,000 ids, holding ids already
// entered and ids repeated within it, is counted against the caps as the
// set of its new ids, at the exact boundary of each cap: one more than
// fits enters nothing; exactly what fits enters every new id once.
func TestQueueQuotaLargeBatchBoundary(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	var earlier, batch []tasks.Notification
	for i := range 700 {
		earlier = append(earlier, queuedSMS("acme", i))
	}
	fresh := map[string]bool{}
	for i := range 2300 {
		n := queuedSMS("acme", i)
		fresh[n.ID] = true
		batch = append(batch, n)
		if i%3 == 0 {
			batch = append(batch, n) // repeated within the batch
		}
		if i%5 == 0 {
			batch = append(batch, earlier[i%len(earlier)]) // entered before
		}
	}
	one := tasks.StoredBytes(batch[0])
	for _, n := range append(earlier, batch...) {
		if tasks.StoredBytes(n) != one {
			t.Fatalf("sizes differ: %d and %d", tasks.StoredBytes(n), one)
		}
	}
	want := int64(len(earlier) + len(fresh))
	for _, c := range []struct {
		caps tasks.Caps
		fits bool
	}{
		{tasks.Caps{Notifications: want - 1, TTL: time.Hour}, false},
		{tasks.Caps{Bytes: (want - 1) * one, TTL: time.Hour}, false},
		{tasks.Caps{Notifications: want, Bytes: want * one, TTL: time.Hour}, true},
	} {
		rdb.FlushAll(ctx)
		q := tasks.NewQueueQuota(rdb, c.caps)
		if err := q.Reserve(ctx, earlier...); err != nil {
			t.Fatal(err)
		}
		err := q.Reserve(ctx, batch...)
		if c.fits != (err == nil) {
			t.Fatalf("caps %+v: %d ids in all: %v", c.caps, want, err)
		}
		var full *tasks.QueueFullError
		if !c.fits && (!errors.As(err, &full) || full.Want != int64(len(fresh))*map[bool]int64{true: one, false: 1}[full.Cap == "bytes"]) {
			t.Fatalf("caps %+v: %v (%+v), want %d new", c.caps, err, full, len(fresh))
		}
		got := int64(len(earlier))
		if c.fits {
			got = want
		}
		if u, err := q.Usage(ctx, "acme"); err != nil || u.Notifications != got || u.Bytes != got*one {
			t.Fatalf("caps %+v: usage %+v %v, want %d of %d B", c.caps, u, err, got, one)
		}
	}
}
