package throttle_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// With WaitReplicas 1 an admission returns only once the replica holds it.
// While no replica acknowledges, an admitting check fails with
// ErrNotReplicated (the caller sends nothing) and gives the admission back, checks that admit nothing
// and done records do not wait, and the same run asking again once the
// replica is back gets its own admission — counted once.
func TestWaitReplicas(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	mc, rc := master.Client(t), replica.Client(t)
	lim, err := throttle.New(mc, throttle.Options{Secret: testSecret, WaitReplicas: 1, WaitTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	rule := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 2, Window: time.Hour}}
	key, _ := lim.Key("acme", rule)
	reserve := func(id, nonce string) (throttle.Decision, error) {
		return lim.Reserve(ctx, "acme", id, throttle.ReserveOptions{Nonce: nonce}, rule)
	}

	d, err := reserve("n1", "run-1")
	if err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("with the replica up: %+v, %v", d, err)
	}
	// Acknowledged means the replica has it, not only that WAIT returned.
	if n := rc.ZCard(ctx, key).Val(); n != 1 {
		t.Fatalf("the replica holds %d entries after an acknowledged admission, want 1", n)
	}

	replica.BreakReplication(t, master)
	start := time.Now()
	d, err = reserve("n2", "run-2")
	if !errors.Is(err, throttle.ErrNotReplicated) {
		t.Fatalf("with the replica cut off: %+v, %v; want ErrNotReplicated", d, err)
	}
	if d != (throttle.Decision{}) {
		t.Fatalf("a decision came with the error: %+v", d)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("failed after %v, before WaitTimeout", took)
	}
	if !strings.Contains(err.Error(), "0 of 1 within 1s") {
		t.Fatalf("error does not say how many acknowledged: %v", err)
	}
	// Given back at once: an unacknowledged admission held while replicas
	// catch up would have every other check booked behind it.
	if n := mc.ZCard(ctx, key).Val(); n != 1 {
		t.Fatalf("the master holds %d entries after an admission no replica acknowledged, want 1 (n1; n2 given back)", n)
	}
	// Nothing to acknowledge: a full window (n1 under a limit of 1) denies
	// at once, without error.
	one := rule
	one.Rule.Limit = 1
	if d, err := lim.Reserve(ctx, "acme", "n3", throttle.ReserveOptions{Nonce: "run-3"}, one); err != nil || d.Status != throttle.StatusDenied {
		t.Fatalf("a denial with the replica cut off: %+v, %v", d, err)
	}
	if err := lim.MarkDone(ctx, "acme", "n1", 1, time.Hour); err != nil {
		t.Fatalf("a done record waited for replicas: %v", err)
	}

	replica.MendReplication(t)
	caughtUp(t, mc)
	d, err = reserve("n2", "run-2")
	if err != nil || d.Status != throttle.StatusAdmitted || d.Attempt != 1 {
		t.Fatalf("the same run asking again with the replica back: %+v, %v", d, err)
	}
	u, err := lim.Usage(ctx, "acme", 0, rule)
	if err != nil || u[0].Used != 2 {
		t.Fatalf("window holds %+v (%v), want n1 and n2 once each", u, err)
	}
	if n := rc.ZCard(ctx, key).Val(); n != 2 {
		t.Fatalf("the replica holds %d entries, want 2", n)
	}
}

// The lost-reply path — the same run asking again, on a connection that
// never wrote, the script writing nothing new — still makes WAIT cover the
// admission (Redis moves a connection's WAIT offset on every command). The
// replica is connected but frozen: it acknowledges nothing new, and the
// earlier admission is not on it.
func TestWaitReplicasCoversARetryOnAnotherConnection(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	plain, err := throttle.New(master.Client(t), throttle.Options{Secret: testSecret, Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	rule := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550101", Rule: throttle.Rule{Limit: 5, Window: time.Hour}}
	replica.Freeze(t)
	// Admitted without waiting (a limiter without the option, standing in
	// for a reply lost before its WAIT): the replica has not acknowledged it.
	if d, err := plain.Reserve(ctx, "acme", "n1", throttle.ReserveOptions{Nonce: "run-1"}, rule); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	fresh := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer fresh.Close()
	acked, err := throttle.New(fresh, throttle.Options{Secret: testSecret, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer acked.Close()
	if d, err := acked.Reserve(ctx, "acme", "n1", throttle.ReserveOptions{Nonce: "run-1"}, rule); !errors.Is(err, throttle.ErrNotReplicated) {
		t.Fatalf("the run's own admission, not acknowledged by the replica, came back as %+v, %v; want ErrNotReplicated", d, err)
	}
	replica.Thaw(t)
	caughtUp(t, fresh)
	if d, err := acked.Reserve(ctx, "acme", "n1", throttle.ReserveOptions{Nonce: "run-1"}, rule); err != nil || d.Status != throttle.StatusAdmitted || d.Attempt != 1 {
		t.Fatalf("with the replica back: %+v, %v", d, err)
	}
}

// WaitReplicas is refused where it cannot work: a negative count, a client
// kind without one master per key, a timeout the client's reads would cut.
func TestWaitReplicasOptions(t *testing.T) {
	t.Parallel()
	_, c := setupRedis(t)
	for name, o := range map[string]throttle.Options{
		"negative":      {WaitReplicas: -1},
		"above reads":   {WaitReplicas: 1, WaitTimeout: 5 * time.Second},
		"ring of nodes": {WaitReplicas: 1},
	} {
		o.Secret = testSecret
		var client redis.UniversalClient = c
		if name == "ring of nodes" {
			ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": c.Options().Addr}})
			defer ring.Close()
			client = ring
		}
		if _, err := throttle.New(client, o); err == nil {
			t.Errorf("%s: accepted %+v", name, o)
		}
	}
}

// On a Cluster the WAIT goes to the master of the check's slot: with one
// master's replica cut off, admissions of groups on that master fail with
// ErrNotReplicated and those on the other masters go through.
func TestWaitReplicasCluster(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	cl, cc := redistest.NewCluster(t, 3, 1)
	lim, err := throttle.New(cc, throttle.Options{Secret: testSecret, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	rule := throttle.Limit{Scope: "sms:tenant", Rule: throttle.PerHour(100)}
	masterOf := func(group string) string {
		k, _ := lim.Key(group, rule)
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	cut := masterOf("tenant-0")
	master := cl.Node(t, cut)
	cl.ReplicaOf(t, master).BreakReplication(t, master)
	var onCut, elsewhere int
	for g := 0; g < 12; g++ {
		group := fmt.Sprintf("tenant-%d", g)
		_, err := lim.Reserve(ctx, group, "n-"+group, throttle.ReserveOptions{}, rule)
		switch {
		case masterOf(group) == cut:
			onCut++
			if !errors.Is(err, throttle.ErrNotReplicated) {
				t.Errorf("%s, on the master whose replica is cut off: %v; want ErrNotReplicated", group, err)
			}
		default:
			elsewhere++
			if err != nil {
				t.Errorf("%s, on a master with its replica: %v", group, err)
			}
		}
	}
	if onCut == 0 || elsewhere == 0 {
		t.Fatalf("groups on the cut master %d, elsewhere %d: want both", onCut, elsewhere)
	}
}

// At maxmemory under noeviction, with Redis refusing other writes, a check
// still records what it admits and a done record is still written, both
// ways the limiter runs: as a function (allow-oom lets its writes through)
// and as a script, where each op begins with a write Redis never refuses
// for memory, after which it lets the script's writes through. So no send
// goes out that the windows do not hold.
func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	for i, r := range []throttle.Rule{{Limit: 5, Window: time.Hour}, {Limit: 5, Window: time.Hour, Buckets: 6}, throttle.PerCalendar(5, throttle.Day, "America/New_York")} {
		for _, asScript := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/script=%v", r, asScript), func(t *testing.T) {
				t.Parallel()
				srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
				c := srv.Client(t)
				if asScript {
					// A user whose ACL forbids functions: the limiter runs as the script.
					if err := c.Do(ctx, "ACL", "SETUSER", "scripts-only", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-fcall_ro", "-function").Err(); err != nil {
						t.Fatal(err)
					}
					c = redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "scripts-only", Password: "pw"})
					t.Cleanup(func() { c.Close() })
				}
				lim, err := throttle.New(c, throttle.Options{Secret: testSecret})
				if err != nil {
					t.Fatal(err)
				}
				defer lim.Close()
				rule := throttle.Limit{Scope: "sms:recipient", Subject: fmt.Sprint("+1415555010", i), Rule: r}
				// A first check loads the function library (Redis refuses
				// FUNCTION LOAD at maxmemory: the limiter would run as the
				// script meanwhile).
				if _, err := lim.Reserve(ctx, "warm", "w1", throttle.ReserveOptions{}, rule); err != nil {
					t.Fatal(err)
				}
				free := srv.Overfill(t)
				admin := srv.Client(t)
				admin.ConfigResetStat(ctx)
				d, err := lim.Reserve(ctx, "acme", "n1", throttle.ReserveOptions{}, rule)
				if err != nil || d.Status != throttle.StatusAdmitted {
					t.Fatalf("at maxmemory: %+v, %v", d, err)
				}
				if u, err := lim.Usage(ctx, "acme", 0, rule); err != nil || u[0].Used != 1 {
					t.Fatalf("the admission is not in its window: %+v, %v", u, err)
				}
				if err := lim.MarkDone(ctx, "acme", "n1", 1, time.Hour); err != nil {
					t.Fatalf("done record at maxmemory: %v", err)
				}
				if d, err := lim.Reserve(ctx, "acme", "n1", throttle.ReserveOptions{}, rule); err != nil || d.Status != throttle.StatusDone {
					t.Fatalf("asking again after the done record: %+v, %v", d, err)
				}
				if err := c.Set(ctx, "other-app", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
					t.Fatalf("Redis takes other writes (%v): the test did not run at maxmemory", err)
				}
				if f := calls(t, admin, "fcall"); (f > 0) == asScript {
					t.Fatalf("%d FCALLs at maxmemory; want them exactly when the limiter runs as a function", f)
				}
				free()
			})
		}
	}
}

// caughtUp waits until the replica of c's master has acknowledged
// everything written so far (a write, then WAIT), so that the next check's
// own WAIT does not race the replica's catching up.
func caughtUp(t *testing.T, c *redis.Client) {
	t.Helper()
	if err := c.Set(ctx, "caught-up", time.Now().String(), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("the replica did not catch up within 10 s: %d, %v", n, err)
	}
}
