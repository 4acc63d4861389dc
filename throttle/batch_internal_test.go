package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
)

// reserveCalls gives a limiter on a private redis-server and a maker of raw
// reserve calls for id in group "g", one rule of 1/min, with the given ARGV
// (nil: the full ARGV of reserveArgs).
func reserveCalls(t *testing.T) (*Limiter, *redis.Client, func(id string, args []any) *call) {
	t.Helper()
	_, c := redistest.New(t)
	l, err := New(c, Options{Secret: []byte("0123456789abcdef0123")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	key, _ := l.Key("g", Limit{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 1, Window: time.Minute}})
	return l, c, func(id string, args []any) *call {
		if args == nil {
			args = reserveArgs(id)
		}
		return &call{done: make(chan struct{}), op: &op{code: "R", keys: []string{key, l.StateKey("g", id)}, args: args}}
	}
}

// reserveArgs is a reserve operation's whole ARGV for id, as its encoder writes it: policy
// at-least-once, one rule of 1/60 s, no closed intervals, consent, note, counters or holds.
func reserveArgs(id string) []any {
	o := reserveOp{member: id, policy: AtLeastOnce, stateTTL: time.Minute, table: time.Now,
		limits: []Limit{{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 1, Window: time.Minute}}}}
	return o.build().args
}

// One batch carries several independent ops: each answers for itself, a
// failing op fails alone, and they all share one clock reading.
func TestBatchIsolatesOps(t *testing.T) {
	t.Parallel()
	l, c, mk := reserveCalls(t)
	c.Set(context.Background(), l.StateKey("g", "bad"), "garbage", time.Minute)
	calls := []*call{mk("a", nil), mk("bad", nil), mk("b", nil), {done: make(chan struct{}), op: &op{code: "Q"}}}
	l.batch.exec(context.Background(), calls)
	if calls[0].err != nil || calls[0].reply[0] != int64(StatusAdmitted) {
		t.Fatalf("a: %v %v", calls[0].reply, calls[0].err)
	}
	if calls[1].err == nil || !strings.Contains(calls[1].err.Error(), "garbage") {
		t.Fatalf("bad: %v %v; want the state error", calls[1].reply, calls[1].err)
	}
	if calls[2].err != nil || calls[2].reply[0] != int64(StatusDenied) {
		t.Fatalf("b after a (limit 1): %v %v", calls[2].reply, calls[2].err)
	}
	if calls[3].err == nil || !strings.Contains(calls[3].err.Error(), "unknown opcode") {
		t.Fatalf("unknown op: %v", calls[3].err)
	}
	if calls[0].now != calls[2].now {
		t.Fatalf("one batch, two clocks: %d %d", calls[0].now, calls[2].now)
	}
}

// A reserve operation too short for its fixed arguments fails alone, with
// its own error: it never reads the next operation's arguments as its own.
func TestShortReserveFailsAlone(t *testing.T) {
	t.Parallel()
	l, _, mk := reserveCalls(t)
	// Cut in the fixed values (no count of rules) and in the rules (no drop flag).
	calls := []*call{mk("short1", reserveArgs("short1")[:14]), mk("short2", reserveArgs("short2")[:22]), mk("a", nil)}
	l.batch.exec(context.Background(), calls)
	for _, sc := range calls[:2] {
		if sc.err == nil || !strings.Contains(sc.err.Error(), "reserve: too few arguments") {
			t.Fatalf("%s: %v %v; want the too-few-arguments error", sc.op.args[0], sc.reply, sc.err)
		}
	}
	if calls[2].err != nil || calls[2].reply[0] != int64(StatusAdmitted) {
		t.Fatalf("a after the short ones: %v %v; want admitted (nothing counted for them)", calls[2].reply, calls[2].err)
	}
}

// Concurrent calls travel together: far fewer script calls than checks.
func TestBatchCoalesces(t *testing.T) {
	t.Parallel()
	_, c := redistest.New(t)
	l, _ := New(c, Options{Secret: []byte("0123456789abcdef0123"), Pipelines: 2})
	defer l.Close()
	ctx := context.Background()
	c.ConfigResetStat(ctx)
	const callers, each = 64, 20
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < each; i++ {
				lim := Limit{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 1_000_000, Window: time.Minute}}
				if _, err := l.Allow(ctx, "g", NewTestID(), lim); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	stats := c.Info(ctx, "commandstats").Val()
	calls := scriptCalls(stats)
	if calls == 0 || calls > callers*each/2 {
		t.Fatalf("%d checks took %d script calls; want coalescing", callers*each, calls)
	}
	t.Logf("%d checks in %d script calls (%.1f per call)", callers*each, calls, float64(callers*each)/float64(calls))
}

// A call whose context is done before it is sent writes nothing.
func TestBatchCancelledCallWritesNothing(t *testing.T) {
	t.Parallel()
	_, c := redistest.New(t)
	l, _ := New(c, Options{Secret: []byte("0123456789abcdef0123")})
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	lim := Limit{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 1, Window: time.Minute}}
	if _, err := l.Reserve(ctx, "g", "x", ReserveOptions{}, lim); err == nil {
		t.Fatal("cancelled call succeeded")
	}
	if n := c.DBSize(context.Background()).Val(); n != 0 {
		t.Fatalf("cancelled call wrote %d keys", n)
	}
	l.Close()
	if _, err := l.Allow(context.Background(), "g", "y", lim); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

var idN atomic.Int64

// NewTestID returns a distinct member.
func NewTestID() string { return fmt.Sprintf("t%d", idN.Add(1)) }

// scriptCalls sums FCALL, EVAL and EVALSHA calls from INFO commandstats.
func scriptCalls(info string) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_fcall:") || strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			rest := line[strings.Index(line, "calls=")+6:]
			v := 0
			for _, ch := range rest {
				if ch < '0' || ch > '9' {
					break
				}
				v = v*10 + int(ch-'0')
			}
			n += v
		}
	}
	return n
}

// An op Redis refused for memory is told apart from other script errors.
func TestOutOfMemoryReply(t *testing.T) {
	_, err := ints([]any{int64(-1), "OOM command not allowed when used memory > 'maxmemory'."})
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("OOM reply: %v, want ErrOutOfMemory", err)
	}
	if _, err := ints([]any{int64(-1), "state key holds garbage"}); errors.Is(err, ErrOutOfMemory) || err == nil {
		t.Fatalf("other script error: %v", err)
	}
}

// A done record lingering for company rides with the next call: with a
// linger of an hour, MarkDone returns only because a check carried it, in
// the check's script call, and the record is written. Alone it goes after
// its linger.
func TestDoneRecordRidesWithNextCall(t *testing.T) {
	t.Parallel()
	_, c := redistest.New(t)
	ctx := context.Background()
	l, err := New(c, Options{Secret: []byte("0123456789abcdef0123"), DoneLinger: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lim := Limit{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 10, Window: time.Minute}}
	if _, err := l.Reserve(ctx, "g", "sent", ReserveOptions{}, lim); err != nil {
		t.Fatal(err)
	}
	c.ConfigResetStat(ctx)
	done := make(chan error, 1)
	go func() { done <- l.MarkDone(ctx, "g", "sent", 1, time.Hour) }()
	for len(l.batch.carry) == 0 { // the record is waiting to be carried
		select {
		case err := <-done:
			t.Fatalf("MarkDone returned before any call could carry it: %v", err)
		default:
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := l.Reserve(ctx, "g", "next", ReserveOptions{}, lim); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d, err := l.Reserve(ctx, "g", "sent", ReserveOptions{}, lim); err != nil || d.Status != StatusDone {
		t.Fatalf("after the carried record: %v %v, want done", d.Status, err)
	}
	stats, _ := c.Info(ctx, "commandstats").Result()
	if scriptCalls(stats) != 2 {
		t.Fatalf("want 2 script calls (the check carrying the record, then the re-check):\n%s", stats)
	}

	// Alone, the record goes after its linger.
	short, _ := New(c, Options{Secret: []byte("0123456789abcdef0123"), DoneLinger: 5 * time.Millisecond})
	defer short.Close()
	if _, err := short.Reserve(ctx, "g", "alone", ReserveOptions{}, lim); err != nil {
		t.Fatal(err)
	}
	if err := short.MarkDone(ctx, "g", "alone", 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if d, _ := short.Reserve(ctx, "g", "alone", ReserveOptions{}, lim); d.Status != StatusDone {
		t.Fatalf("alone: %v, want done", d.Status)
	}
	// A cancelled MarkDone that nobody carried writes nothing and says so.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		for len(l.batch.carry) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if err := l.MarkDone(cctx, "g", "next", 1, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled lingering MarkDone: %v", err)
	}
	if _, err := New(c, Options{Secret: []byte("0123456789abcdef0123"), DoneLinger: -time.Second}); err == nil {
		t.Fatal("a negative DoneLinger was accepted")
	}
}

// Many concurrent done records and checks with a linger: every record is
// written, every MarkDone returns, in fewer script calls than operations.
func TestDoneRecordsCarriedConcurrently(t *testing.T) {
	t.Parallel()
	_, c := redistest.New(t)
	ctx := context.Background()
	l, _ := New(c, Options{Secret: []byte("0123456789abcdef0123"), DoneLinger: 20 * time.Millisecond})
	defer l.Close()
	lim := Limit{Scope: "sms:tenant", Rule: Rule{Limit: 1_000_000, Window: time.Minute}}
	c.ConfigResetStat(ctx)
	const workers, each = 16, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				id := fmt.Sprintf("n%d-%d", g, i)
				d, err := l.Reserve(ctx, "g", id, ReserveOptions{}, lim)
				if err == nil && d.Status != StatusAdmitted {
					err = fmt.Errorf("%s: %v", id, d.Status)
				}
				if err == nil {
					err = l.MarkDone(ctx, "g", id, d.Attempt, time.Hour)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	stats, _ := c.Info(ctx, "commandstats").Result()
	calls := scriptCalls(stats)
	for g := 0; g < workers; g++ {
		for i := 0; i < each; i++ {
			if d, _ := l.Reserve(ctx, "g", fmt.Sprintf("n%d-%d", g, i), ReserveOptions{}, lim); d.Status != StatusDone {
				t.Fatalf("n%d-%d: %v, want done", g, i, d.Status)
			}
		}
	}
	if ops := 2 * workers * each; calls == 0 || calls >= ops {
		t.Fatalf("%d script calls for %d operations: nothing was carried", calls, ops)
	}
	t.Logf("%d script calls for %d checks and %d done records", calls, workers*each, workers*each)
}
