package consent_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

const ann = "+14155550100"

// A STOP blocks every category but the exempt ones; a category opted out
// by name blocks even an exempt one; an opt-in of one category under the
// blanket opt-out lets it through; START lifts everything. The ledger
// keeps every event, in order, exactly as it was recorded.
func TestOptOutAndBackIn(t *testing.T) {
	t.Parallel()
	b := setup(t, newClock(), consent.Options{})
	if r := b.check(t, tasks.SMS, ann, "marketing", false); r != consent.NotBlocked {
		t.Fatalf("before any event: %v", r)
	}
	steps := []struct {
		e     consent.Event
		check map[string]consent.Reason // category (exempt when prefixed "!") → reason
	}{
		{consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Ref: "SM0123456789abcdef0123456789abcdef", Keyword: "STOP"},
			map[string]consent.Reason{"marketing": consent.BlockedAll, "": consent.BlockedAll, "!otp": consent.NotBlocked}},
		{consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.Categories("otp"), Ref: "req-1"},
			map[string]consent.Reason{"!otp": consent.BlockedCategory, "marketing": consent.BlockedAll}},
		{consent.Event{Action: consent.OptIn, Source: consent.SourceAPI, Scope: consent.Categories("news", "otp"), Ref: "req-2"},
			map[string]consent.Reason{"news": consent.NotBlocked, "!otp": consent.NotBlocked, "otp": consent.NotBlocked, "marketing": consent.BlockedAll}},
		{consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: "QUIT"},
			map[string]consent.Reason{"news": consent.BlockedAll, "!news": consent.NotBlocked, "otp": consent.BlockedAll}},
		{consent.Event{Action: consent.Review, Source: consent.SourceKeyword, Keyword: "DONT TEXT", Ref: "SMffff"},
			map[string]consent.Reason{"news": consent.BlockedAll}},
		{consent.Event{Action: consent.OptIn, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: "START"},
			map[string]consent.Reason{"news": consent.NotBlocked, "marketing": consent.NotBlocked, "otp": consent.NotBlocked}},
	}
	m := model{}
	var want []consent.Event
	for i, st := range steps {
		b.clock.Add(time.Minute)
		got := b.record(t, tasks.SMS, ann, st.e)
		if !got.At.Equal(b.clock.Now()) {
			t.Fatalf("step %d: At %v, want the store's clock %v", i, got.At, b.clock.Now())
		}
		want = append(want, got)
		m.apply(got)
		for cat, r := range st.check {
			exempt := strings.HasPrefix(cat, "!")
			if g := b.check(t, tasks.SMS, ann, strings.TrimPrefix(cat, "!"), exempt); g != r {
				t.Errorf("step %d (%s %s): %q is %v, want %v", i, st.e.Action, st.e.Scope, cat, g, r)
			}
		}
		if got, want := fields(b.state(t, tasks.SMS, ann)), m.fields(); !slices.Equal(got, want) {
			t.Errorf("step %d: fields %v, the model's %v", i, got, want)
		}
	}
	ledger, err := b.store.Ledger(context.Background(), b.tenant, tasks.SMS, ann)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ledger) != fmt.Sprint(want) {
		t.Fatalf("ledger\n%v\nwant\n%v", ledger, want)
	}
	// After START the hash is gone; the ledger keeps its TTL.
	if n, _ := b.rdb.Exists(context.Background(), b.store.Key(b.tenant, tasks.SMS, ann)).Result(); n != 0 {
		t.Fatal("the suppression hash outlived START")
	}
	// Another channel and another tenant saw nothing.
	if r := b.check(t, tasks.Email, "ann@example.com", "marketing", false); r != consent.NotBlocked {
		t.Fatalf("email: %v", r)
	}
}

// Undeliverable blocks every category, exempt ones too, until it lapses;
// set again it keeps the later end, and an end-less mark keeps none. The
// hash's TTL follows its longest mark.
func TestUndeliverableLapses(t *testing.T) {
	t.Parallel()
	b := setup(t, newClock(), consent.Options{})
	ctx := context.Background()
	key := b.store.Key(b.tenant, tasks.SMS, ann)
	start := b.clock.Now()
	b.record(t, tasks.SMS, ann, consent.Event{Action: consent.Undeliverable, Source: consent.SourceProvider, Code: 30005, Until: start.Add(2 * time.Hour)})
	b.record(t, tasks.SMS, ann, consent.Event{Action: consent.Undeliverable, Source: consent.SourceProvider, Code: 30003, Until: start.Add(time.Hour)})
	if r := b.check(t, tasks.SMS, ann, "otp", true); r != consent.BlockedUndeliverable {
		t.Fatalf("exempt otp: %v", r)
	}
	st := b.state(t, tasks.SMS, ann)
	if st.Undeliverable == nil || !st.Undeliverable.Until.Equal(start.Add(2*time.Hour)) || st.Undeliverable.Code != 30003 || st.Undeliverable.Source != consent.SourceProvider {
		t.Fatalf("mark %+v: want the later end and the latest code", st.Undeliverable)
	}
	if ttl, _ := b.rdb.PTTL(ctx, key).Result(); ttl < 2*time.Hour-time.Second || ttl > 2*time.Hour {
		t.Fatalf("hash TTL %v, want 2h", ttl)
	}
	b.clock.Add(2*time.Hour - time.Millisecond)
	if r := b.check(t, tasks.SMS, ann, "marketing", false); r != consent.BlockedUndeliverable {
		t.Fatalf("a millisecond before the end: %v", r)
	}
	b.clock.Add(time.Millisecond)
	if r := b.check(t, tasks.SMS, ann, "marketing", false); r != consent.NotBlocked {
		t.Fatalf("at the end: %v", r)
	}
	if !b.state(t, tasks.SMS, ann).Empty() {
		t.Fatal("State shows a lapsed mark")
	}
	// A lapsing opt-out and an end-less one: the end-less wins, no TTL.
	b.record(t, tasks.Email, "ann@example.com", consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.AllCategories(), Until: b.clock.Now().Add(time.Hour)})
	b.record(t, tasks.Email, "ann@example.com", consent.Event{Action: consent.OptOut, Source: consent.SourceOneClick, Scope: consent.AllCategories()})
	b.record(t, tasks.Email, "ann@example.com", consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.AllCategories(), Until: b.clock.Now().Add(time.Hour)})
	if ttl, _ := b.rdb.PTTL(ctx, b.store.Key(b.tenant, tasks.Email, "ann@example.com")).Result(); ttl != -1 {
		t.Fatalf("TTL %v of a hash with an end-less mark", ttl)
	}
	if m := b.state(t, tasks.Email, "ann@example.com").All; m == nil || !m.Until.IsZero() {
		t.Fatalf("mark %+v, want no end", m)
	}
}

// The consent rule (scripts/consent.lua) agrees with State.Blocks on random
// hashes — expired marks, exempt flags and categories included — wherever
// it runs: inside the limiter's check (Reserve), alone through Store.Check,
// and alone through redis-cli --eval of CheckScript, the very text
// Store.Check sends.
func TestCheckScriptAgreesWithBlocks(t *testing.T) {
	t.Parallel()
	b := setup(t, newClock(), consent.Options{})
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 21))
	clocked, err := throttle.New(b.rdb, throttle.Options{Secret: testSecret, Now: b.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer clocked.Close()
	cats := []string{"marketing", "otp", "news"}
	sources := []consent.Source{consent.SourceKeyword, consent.SourceOneClick, consent.SourceBounce, consent.SourceComplaint, consent.SourceAPI, consent.SourceCLI, consent.SourceProvider}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is not on PATH (it comes with redis-server): %v", err)
	}
	checkLua := filepath.Join(t.TempDir(), "consent_check.lua")
	if err := os.WriteFile(checkLua, []byte(consent.CheckScript), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		to := "+1415555" + fmt.Sprintf("%04d", i)
		for range 1 + rng.IntN(6) {
			b.clock.Add(time.Duration(rng.IntN(90)) * time.Minute)
			e := consent.Event{Source: sources[rng.IntN(len(sources))]}
			switch rng.IntN(5) {
			case 0, 1:
				e.Action = consent.OptOut
			case 2, 3:
				e.Action = consent.OptIn
			default:
				e.Action = consent.Undeliverable
			}
			if rng.IntN(2) == 0 && e.Action != consent.Undeliverable {
				e.Scope = consent.Categories(cats[rng.IntN(3)], cats[rng.IntN(3)])
			} else {
				e.Scope = consent.AllCategories()
			}
			if e.Action != consent.OptIn && rng.IntN(3) == 0 {
				e.Until = b.clock.Now().Add(time.Duration(1+rng.IntN(180)) * time.Minute)
			}
			b.record(t, tasks.SMS, to, e)
		}
		b.clock.Add(time.Duration(rng.IntN(120)) * time.Minute)
		now := b.clock.Now()
		key := b.store.Key(b.tenant, tasks.SMS, to)
		raw, err := b.rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		st := b.state(t, tasks.SMS, to)
		for _, cat := range cats {
			for _, exempt := range []bool{false, true} {
				want := st.Blocks(cat, exempt, now)
				if got := b.check(t, tasks.SMS, to, cat, exempt); got != want {
					t.Fatalf("seed %d %s %s exempt %v: Check %v, Blocks %v (hash %v)", seed, to, cat, exempt, got, want, raw)
				}
				// The same reading queued in a pipeline (a worker's read just
				// before a send that waited); now and then with the script
				// flushed, which it must get past by asking through Check.
				if i%5 == 0 {
					if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
						t.Fatal(err)
					}
				}
				var read func() (consent.Verdict, error)
				_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
					read = b.store.QueueCheck(ctx, p, b.tenant, tasks.SMS, to, cat, exempt)
					return nil
				})
				if v, err := read(); err != nil || v.Reason != want {
					t.Fatalf("seed %d %s %s exempt %v: QueueCheck %v, %v; Blocks %v (hash %v)", seed, to, cat, exempt, v.Reason, err, want, raw)
				}
				// The limiter's own reading, inside its check (scripts/op_reserve.lua).
				d, err := clocked.Reserve(ctx, b.tenant, uuid.NewString(), throttle.ReserveOptions{Policy: throttle.AtLeastOnce,
					Consent: &throttle.ConsentCheck{Key: key, Category: cat, Exempt: exempt}})
				if err != nil {
					t.Fatal(err)
				}
				if got := map[bool]consent.Reason{true: consent.Reason(d.BlockReason), false: consent.NotBlocked}[d.Status == throttle.StatusBlocked]; got != want ||
					(want == consent.NotBlocked) != (d.Status == throttle.StatusAdmitted) {
					t.Fatalf("seed %d %s %s exempt %v: the limiter decided %v (reason %d), Blocks %v (hash %v)", seed, to, cat, exempt, d.Status, d.BlockReason, want, raw)
				}
				if i%6 != 0 {
					continue // redis-cli is a process per call: a sample is enough
				}
				args := []string{"-p", strconv.Itoa(b.srv.Port), "--no-raw", "--eval", checkLua, key, ",",
					strconv.FormatInt(now.UnixMilli(), 10), cat, map[bool]string{false: "0", true: "1"}[exempt]}
				out, err := exec.Command(cli, args...).CombinedOutput()
				if err != nil {
					t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
				}
				if first := strings.Fields(string(out)); len(first) < 2 || first[1] != "(integer)" || first[2] != strconv.Itoa(int(want)) {
					t.Fatalf("seed %d: redis-cli --eval %s %s %s %v:\n%s\nwant reason %d", seed, checkLua, to, cat, exempt, out, want)
				}
			}
		}
	}
}

// Concurrent opt-outs and opt-ins of one recipient end in the state the
// ledger's last events leave, and the ledger records every one of them.
func TestConcurrentOptOutOptIn(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, consent.Options{}) // Redis TIME: the events race for real
	ctx := context.Background()
	const workers, each = 8, 40
	inParallel(t, workers, each, func(w, i int) error {
		e := consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: "STOP", Ref: fmt.Sprintf("w%d-%d", w, i)}
		switch (w + i) % 4 {
		case 1:
			e.Action, e.Keyword = consent.OptIn, "START"
		case 2:
			e.Scope, e.Source, e.Keyword = consent.Categories("marketing"), consent.SourceOneClick, ""
		case 3:
			e.Action, e.Scope, e.Source, e.Keyword = consent.OptIn, consent.Categories("marketing", "news"), consent.SourceAPI, ""
		}
		_, err := b.store.Record(ctx, b.tenant, tasks.SMS, ann, e)
		return err
	})
	ledger, err := b.store.Ledger(ctx, b.tenant, tasks.SMS, ann)
	if err != nil {
		t.Fatal(err)
	}
	if len(ledger) != workers*each {
		t.Fatalf("ledger holds %d events, want %d", len(ledger), workers*each)
	}
	refs := map[string]bool{}
	m := model{}
	for i, e := range ledger {
		refs[e.Ref] = true
		if i > 0 && e.At.Before(ledger[i-1].At) {
			t.Fatalf("event %d at %v before the one before it (%v)", i, e.At, ledger[i-1].At)
		}
		m.apply(e)
	}
	if len(refs) != workers*each {
		t.Fatalf("%d distinct events in the ledger, want %d", len(refs), workers*each)
	}
	if got := fields(b.state(t, tasks.SMS, ann)); !slices.Equal(got, m.fields()) {
		t.Fatalf("state %v, but the ledger's events in order leave %v", got, m.fields())
	}
}

// No key and no value holds the recipient in clear, in any form.
func TestNoRecipientInClear(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, consent.Options{})
	ctx := context.Background()
	b.record(t, tasks.SMS, "+1 (415) 555-0100", consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: "STOP"})
	b.record(t, tasks.SMS, ann, consent.Event{Action: consent.Review, Source: consent.SourceKeyword, Keyword: "WRONG NUMBER"})
	b.record(t, tasks.Email, "Ann.Lee@Example.com", consent.Event{Action: consent.OptOut, Source: consent.SourceOneClick, Scope: consent.Categories("news")})
	b.record(t, tasks.Email, "Ann.Lee@Example.com", consent.Event{Action: consent.Undeliverable, Source: consent.SourceBounce, Code: 550})
	var dump strings.Builder
	keys, err := b.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4 {
		t.Fatalf("keys %v, want a hash and a ledger per recipient", keys)
	}
	for _, k := range keys {
		dump.WriteString(k + "\n")
		switch typ := b.rdb.Type(ctx, k).Val(); typ {
		case "hash":
			for f, v := range b.rdb.HGetAll(ctx, k).Val() {
				dump.WriteString(f + "=" + v + "\n")
			}
		case "list":
			dump.WriteString(strings.Join(b.rdb.LRange(ctx, k, 0, -1).Val(), "\n") + "\n")
		default:
			t.Fatalf("%s is a %s", k, typ)
		}
	}
	for _, clear := range []string{"4155550100", "415) 555", "555-0100", "ann.lee", "Ann.Lee", "example.com", "Example"} {
		if strings.Contains(dump.String(), clear) {
			t.Fatalf("%q at rest:\n%s", clear, dump.String())
		}
	}
	// The spellings of one number or address are one key.
	if b.store.Key(b.tenant, tasks.SMS, "+1 415.555.0100") != b.store.Key(b.tenant, tasks.SMS, ann) ||
		b.store.Key(b.tenant, tasks.Email, "Ann Lee <ANN.LEE@example.com>") != b.store.Key(b.tenant, tasks.Email, "ann.lee@example.com") {
		t.Fatal("spellings of one recipient have different keys")
	}
	want := b.lim.SubjectKey(b.tenant, "consent:sms", ann)
	if got := b.store.Key(b.tenant, tasks.SMS, ann); got != want || !strings.HasPrefix(got, "sl1:{"+b.tenant+"}:consent:sms:") {
		t.Fatalf("Key = %q, want %q", got, want)
	}
}

// The ledger keeps events for the retention and at most MaxEvents per
// recipient; reads skip what aged out before the next write dropped it.
func TestLedgerRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, newClock(), consent.Options{Retention: 48 * time.Hour, MaxEvents: 5})
	ctx := context.Background()
	ledger := func() []string {
		t.Helper()
		evs, err := b.store.Ledger(ctx, b.tenant, tasks.SMS, ann)
		if err != nil {
			t.Fatal(err)
		}
		var refs []string
		for _, e := range evs {
			refs = append(refs, e.Ref)
		}
		return refs
	}
	for i := range 7 {
		b.record(t, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceCLI, Scope: consent.AllCategories(), Ref: fmt.Sprintf("r%d", i)})
		b.clock.Add(time.Hour)
	}
	if got := ledger(); !slices.Equal(got, []string{"r2", "r3", "r4", "r5", "r6"}) {
		t.Fatalf("after 7 events with MaxEvents 5: %v", got)
	}
	lkey := strings.Replace(b.store.Key(b.tenant, tasks.SMS, ann), ":consent:", ":ledger:", 1)
	if ttl := b.rdb.PTTL(ctx, lkey).Val(); ttl < 47*time.Hour || ttl > 48*time.Hour {
		t.Fatalf("ledger TTL %v, want the retention", ttl)
	}
	// r2 was recorded at +2h: at +50h it is exactly the retention old and
	// still in; a millisecond later it is out, r3 (+3h) still in.
	b.clock.Add(50*time.Hour - 7*time.Hour)
	if got := ledger(); !slices.Equal(got, []string{"r2", "r3", "r4", "r5", "r6"}) {
		t.Fatalf("at +50h: %v", got)
	}
	b.clock.Add(time.Millisecond)
	if got := ledger(); !slices.Equal(got, []string{"r3", "r4", "r5", "r6"}) {
		t.Fatalf("at +50h: %v", got)
	}
	b.clock.Add(2 * time.Hour) // +52h: r3 and r4 out
	b.record(t, tasks.SMS, ann, consent.Event{Action: consent.OptIn, Source: consent.SourceCLI, Scope: consent.AllCategories(), Ref: "r7"})
	if n := b.rdb.LLen(ctx, lkey).Val(); n != 3 {
		t.Fatalf("the write at +52h left %d entries, want r5, r6, r7", n)
	}
	if got := ledger(); !slices.Equal(got, []string{"r5", "r6", "r7"}) {
		t.Fatalf("at +52h: %v", got)
	}
}

// An opt-out is recorded even when Redis is at maxmemory (noeviction),
// where an ordinary write is refused.
func TestOptOutAtMaxMemory(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, consent.Options{})
	free := b.srv.Overfill(t)
	defer free()
	b.record(t, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: "STOP"})
	if r := b.check(t, tasks.SMS, ann, "marketing", false); r != consent.BlockedAll {
		t.Fatalf("after an opt-out at maxmemory: %v", r)
	}
	if evs, err := b.store.Ledger(context.Background(), b.tenant, tasks.SMS, ann); err != nil || len(evs) != 1 {
		t.Fatalf("ledger %v, %v", evs, err)
	}
}

// delivery's SMS suppression list moves into the hashes without knowing a
// number: code, end and a ledger event, the old key gone; again, nothing.
func TestMigrateDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, newClock(), consent.Options{})
	migrateDelivery(t, b.rdb, b.lim, b.store, b.clock, b.tenant)
}

// The same on a 3-master Cluster: the scan visits every master, and each
// move runs on its tenant's slot.
func TestMigrateDeliveryOnCluster(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.NewCluster(t, 3, 0)
	lim, err := throttle.New(rdb, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	clock := newClock()
	s, err := consent.NewStore(rdb, lim, consent.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	migrateDelivery(t, rdb, lim, s, clock, "acme", "beta", "gamma", "delta", "eps")
}

func migrateDelivery(t *testing.T, rdb redisClient, lim *throttle.Limiter, s *consent.Store, clock *manualClock, tenants ...string) {
	t.Helper()
	ctx := context.Background()
	d := delivery.NewStore(rdb, lim)
	numbers := []string{"+14155550100", "+14155550101", "+13055550100"}
	for _, tenant := range tenants {
		for i, n := range numbers {
			if err := d.Suppress(ctx, tenant, tasks.SMS, n, 21610+i, time.Duration(i+1)*time.Hour); err != nil {
				t.Fatal(err)
			}
		}
	}
	moved, err := s.MigrateDelivery(ctx)
	if err != nil || moved != len(tenants)*len(numbers) {
		t.Fatalf("MigrateDelivery = %d, %v; want %d", moved, err, len(tenants)*len(numbers))
	}
	for _, tenant := range tenants {
		for i, n := range numbers {
			if _, on, err := d.Suppressed(ctx, tenant, tasks.SMS, n); err != nil || on {
				t.Fatalf("%s %s still on the old list (%v)", tenant, n, err)
			}
			v, err := s.Check(ctx, tenant, tasks.SMS, n, "otp", true)
			if err != nil || v.Reason != consent.BlockedUndeliverable || v.Mark.Code != 21610+i || v.Mark.Source != consent.SourceProvider {
				t.Fatalf("%s %s after the move: %+v %+v, %v", tenant, n, v, v.Mark, err)
			}
			if end := clock.Now().Add(time.Duration(i+1) * time.Hour); v.Mark.Until.Before(end.Add(-5*time.Second)) || v.Mark.Until.After(end) {
				t.Fatalf("%s %s ends %v, want about %v", tenant, n, v.Mark.Until, end)
			}
			evs, err := s.Ledger(ctx, tenant, tasks.SMS, n)
			if err != nil || len(evs) != 1 || evs[0].Action != consent.Undeliverable || evs[0].Ref != "delivery-migration" || evs[0].Code != 21610+i {
				t.Fatalf("%s %s ledger %+v, %v", tenant, n, evs, err)
			}
		}
	}
	if again, err := s.MigrateDelivery(ctx); err != nil || again != 0 {
		t.Fatalf("a second run moved %d (%v)", again, err)
	}
}

// Bad input is an error wrapping ErrInvalid, and nothing is written.
func TestInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, consent.Options{})
	ctx := context.Background()
	ok := consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.AllCategories()}
	for name, tc := range map[string]struct {
		tenant string
		ch     tasks.Channel
		to     string
		e      consent.Event
	}{
		"tenant":              {"a b", tasks.SMS, ann, ok},
		"channel":             {b.tenant, "fax", ann, ok},
		"recipient":           {b.tenant, tasks.SMS, " ", ok},
		"action":              {b.tenant, tasks.SMS, ann, consent.Event{Action: "pause", Source: consent.SourceAPI, Scope: consent.AllCategories()}},
		"source":              {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: "fax", Scope: consent.AllCategories()}},
		"no scope":            {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceAPI}},
		"bad category":        {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.Categories("Big Sale")}},
		"both scopes":         {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.Scope{All: true, Categories: []string{"x"}}}},
		"unsorted":            {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.Scope{Categories: []string{"b", "a"}}}},
		"undeliverable scope": {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.Undeliverable, Source: consent.SourceBounce, Scope: consent.Categories("x")}},
		"ref":                 {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.AllCategories(), Ref: "a|b"}},
		"keyword":             {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: "stop"}},
		"code":                {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.Undeliverable, Source: consent.SourceBounce, Code: -1}},
		"opt-in until":        {b.tenant, tasks.SMS, ann, consent.Event{Action: consent.OptIn, Source: consent.SourceAPI, Scope: consent.AllCategories(), Until: time.Now().Add(time.Hour)}},
	} {
		if _, err := b.store.Record(ctx, tc.tenant, tc.ch, tc.to, tc.e); !errors.Is(err, consent.ErrInvalid) {
			t.Errorf("%s: Record = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := b.store.Check(ctx, b.tenant, tasks.SMS, ann, "No Such", false); !errors.Is(err, consent.ErrInvalid) {
		t.Errorf("Check with a bad category: %v", err)
	}
	if n := b.rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("%d keys written by refused events", n)
	}
	for _, o := range []consent.Options{{Retention: time.Hour}, {Retention: 21 * 365 * 24 * time.Hour}, {MaxEvents: -1}, {MaxEvents: consent.MaxMaxEvents + 1}} {
		if _, err := consent.NewStore(b.rdb, b.lim, o); !errors.Is(err, consent.ErrInvalid) {
			t.Errorf("NewStore(%+v) = %v", o, err)
		}
	}
	if _, err := consent.ParseScope("a,,b"); !errors.Is(err, consent.ErrInvalid) {
		t.Errorf("ParseScope(a,,b) = %v", err)
	}
	if s, err := consent.ParseScope(" news , alerts "); err != nil || s.String() != "alerts,news" {
		t.Errorf("ParseScope = %v, %v", s, err)
	}
	// A value something else wrote is an error on read and blocks in the check.
	key := b.store.Key(b.tenant, tasks.SMS, ann)
	b.rdb.HSet(ctx, key, "*", "garbage")
	if _, err := b.store.State(ctx, b.tenant, tasks.SMS, ann); !errors.Is(err, consent.ErrUnreadable) {
		t.Errorf("State of a garbled hash: %v", err)
	}
	if r := b.check(t, tasks.SMS, ann, "marketing", false); r != consent.BlockedAll {
		t.Errorf("a garbled mark does not block: %v", r)
	}
}
