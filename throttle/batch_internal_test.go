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

	"github.com/sluicehq/sluice/internal/redistest"
)

// One batch carries several independent ops: each answers for itself, a
// failing op fails alone, and they all share one clock reading.
func TestBatchIsolatesOps(t *testing.T) {
	t.Parallel()
	_, c := redistest.New(t)
	l, err := New(c, Options{Secret: []byte("0123456789abcdef0123")})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lim := Limit{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 1, Window: time.Minute}}
	key, _ := l.Key("g", lim)
	c.Set(context.Background(), l.StateKey("g", "bad"), "garbage", time.Minute)
	mk := func(id string) *call {
		return &call{done: make(chan struct{}), op: &op{code: "R", keys: []string{key, l.StateKey("g", id)},
			args: []any{id, "f", 0, 0, "0", "", 0, "", 60000, "", "0", 1, 1, 60000, "0", 0, "0", "", "0", 0}}}
	}
	calls := []*call{mk("a"), mk("bad"), mk("b"), {done: make(chan struct{}), op: &op{code: "Q"}}}
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

// scriptCalls sums EVAL and EVALSHA calls from INFO commandstats.
func scriptCalls(info string) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
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
