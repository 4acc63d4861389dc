package sluicetest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// fakeTB records the failures of a helper under test and its cleanups (run
// by cleanup); Fatal ends the goroutine, as testing.T's does.
type fakeTB struct {
	testing.TB
	failure  string // of Fatal
	errors   string // of Errorf
	logs     string // of Logf
	cleanups []func()
}

func (f *fakeTB) Helper()          {}
func (f *fakeTB) Cleanup(c func()) { f.cleanups = append(f.cleanups, c) }

func (f *fakeTB) Errorf(format string, args ...any) { f.errors += fmt.Sprintf(format, args...) }

func (f *fakeTB) Logf(format string, args ...any) { f.logs += fmt.Sprintf(format, args...) }

func (f *fakeTB) Failed() bool { return f.failure != "" || f.errors != "" }

func (f *fakeTB) cleanup() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func (f *fakeTB) Fatal(args ...any) { f.failure = fmt.Sprint(args...); runtime.Goexit() }

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs f on its own goroutine with a fake TB and returns how it
// failed the test, "" if it did not.
func failure(f func(tb testing.TB)) string {
	tb := &fakeTB{}
	done := make(chan struct{})
	go func() { defer close(done); f(tb) }()
	<-done
	return tb.failure
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	calls := 0
	start := time.Now()
	msg := failure(func(tb testing.TB) {
		sluicetest.Eventually(tb, 5*time.Second, "the third call", func() bool { calls++; return calls == 3 })
	})
	if msg != "" || calls != 3 {
		t.Fatalf("failed %q after %d calls; want no failure after 3", msg, calls)
	}
	if d := time.Since(start); d < 2*sluicetest.Tick {
		t.Fatalf("3 checks took %v; want two ticks of %v between them", d, sluicetest.Tick)
	}
}

// The Every variants check at their own pace.
func TestEventuallyEvery(t *testing.T) {
	t.Parallel()
	calls := 0
	start := time.Now()
	msg := failure(func(tb testing.TB) {
		sluicetest.EventuallyEvery(tb, 5*time.Second, 100*time.Millisecond, "the second call", func() bool { calls++; return calls == 2 })
	})
	if d := time.Since(start); msg != "" || calls != 2 || d < 100*time.Millisecond {
		t.Fatalf("failed %q after %d calls in %v; want no failure after 2, a tick of 100ms apart", msg, calls, d)
	}
	calls = 0
	msg = failure(func(tb testing.TB) {
		sluicetest.EventuallyValueEvery(tb, 250*time.Millisecond, 100*time.Millisecond, "never", func() (int, bool) { calls++; return calls, false })
	})
	// At once, at 100 and 200 ms, and at the timeout: 4 calls (a stalled
	// goroutine may drop a tick or take one more), not Tick's 13.
	if msg != fmt.Sprintf("timed out after 250ms waiting for never; last: %d", calls) || calls < 2 || calls > 5 {
		t.Fatalf("failure %q after %d calls", msg, calls)
	}
}

func TestEventuallyFailsNamingWhatAndTheTimeout(t *testing.T) {
	t.Parallel()
	start := time.Now()
	msg := failure(func(tb testing.TB) {
		sluicetest.Eventually(tb, 100*time.Millisecond, "the moon", func() bool { return false })
	})
	if msg != "timed out after 100ms waiting for the moon" {
		t.Fatalf("failure %q", msg)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("gave up after %v, before the timeout", d)
	}
}

// A condition that holds by the time the timeout passes counts, even if
// no tick came between.
func TestEventuallyChecksAtTheTimeout(t *testing.T) {
	t.Parallel()
	start := time.Now()
	msg := failure(func(tb testing.TB) {
		sluicetest.Eventually(tb, sluicetest.Tick/2, "half a tick", func() bool { return time.Since(start) >= sluicetest.Tick/2 })
	})
	if msg != "" {
		t.Fatalf("failure %q", msg)
	}
}

func TestEventuallyValueReportsTheLastValue(t *testing.T) {
	t.Parallel()
	n := 0
	var got int
	msg := failure(func(tb testing.TB) {
		got = sluicetest.EventuallyValue(tb, 5*time.Second, "n to reach 4", func() (int, bool) { n++; return n, n == 4 })
	})
	if msg != "" || got != 4 {
		t.Fatalf("returned %d, failure %q; want 4", got, msg)
	}
	type state struct{ Queued, Sent int }
	msg = failure(func(tb testing.TB) {
		sluicetest.EventuallyValue(tb, 60*time.Millisecond, "all sent", func() (state, bool) { return state{Queued: 2, Sent: 1}, false })
	})
	if msg != "timed out after 60ms waiting for all sent; last: {Queued:2 Sent:1}" {
		t.Fatalf("failure %q", msg)
	}
}

func TestWaitReturnsAnError(t *testing.T) {
	t.Parallel()
	if err := sluicetest.Wait(time.Second, "true", func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	err := sluicetest.Wait(30*time.Millisecond, "false", func() bool { return false })
	if err == nil || err.Error() != "timed out after 30ms waiting for false" {
		t.Fatalf("Wait = %v", err)
	}
}

// WaitFor is woken by the writes themselves, from other goroutines.
func TestLogBufferWaitFor(t *testing.T) {
	t.Parallel()
	var l sluicetest.LogBuffer
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * time.Millisecond)
			fmt.Fprintf(&l, "line %d\n", i)
		})
	}
	got := l.WaitFor(t, 5*time.Second, "ten lines", func(s string) bool { return strings.Count(s, "\n") == 10 })
	wg.Wait()
	if got != l.String() || !strings.Contains(got, "line 9\n") {
		t.Fatalf("WaitFor returned %q; written %q", got, l.String())
	}
	msg := failure(func(tb testing.TB) {
		l.WaitFor(tb, 30*time.Millisecond, "line 10", func(s string) bool { return strings.Contains(s, "line 10") })
	})
	if !strings.HasPrefix(msg, "timed out after 30ms waiting for line 10; written:\n") || !strings.Contains(msg, "line 9\n") {
		t.Fatalf("failure %q", msg)
	}
}

// Background's run gets a context that ends with the test, and its error
// fails the test.
func TestBackground(t *testing.T) {
	t.Parallel()
	stopped := make(chan struct{})
	t.Run("Runs", func(t *testing.T) {
		started := make(chan struct{})
		sluicetest.Background(t, "runner", func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			close(stopped)
			return nil
		})
		<-started
	})
	select {
	case <-stopped:
	default:
		t.Fatal("the test ended before run returned")
	}
	tb := &fakeTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sluicetest.Background(tb, "runner", func(ctx context.Context) error { <-ctx.Done(); return errors.New("boom") })
	}()
	<-done
	tb.cleanup()
	if tb.errors != "runner: boom" {
		t.Fatalf("errors %q", tb.errors)
	}
}

// FailureLog shows the log's tail after a failure, and nothing otherwise.
func TestFailureLog(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		tb := &fakeTB{}
		l := sluicetest.FailureLog(tb, 2)
		for i := range 5 {
			fmt.Fprintf(l, "line %d\n", i)
		}
		if fail {
			tb.Errorf("the reason")
		}
		tb.cleanup()
		want := ""
		if fail {
			want = "the last 2 lines of the log:\nline 3\nline 4"
		}
		if tb.logs != want {
			t.Errorf("failed %v: logged %q, want %q", fail, tb.logs, want)
		}
	}
	if got := (&sluicetest.LogBuffer{}).Tail(3); got != "" {
		t.Errorf("Tail of nothing = %q", got)
	}
}

func TestEarliestFit(t *testing.T) {
	t.Parallel()
	at := func(ms int64) time.Time { return time.UnixMilli(1_000_000 + ms) }
	slots := func(ms ...int64) []time.Time {
		var out []time.Time
		for _, m := range ms {
			out = append(out, at(m))
		}
		return out
	}
	for _, c := range []struct {
		name  string
		slots []time.Time
		limit int
		from  int64
		want  int64
	}{
		{"empty", nil, 2, 100, 100},
		{"room", slots(0, 50), 3, 100, 100},
		{"full behind", slots(0, 50), 2, 100, 1001},
		{"full ahead", slots(200, 300), 2, 100, 1201},
		{"runs back to back", slots(200, 300, 1201, 1300), 2, 100, 2202},
		{"a gap between runs", slots(200, 300, 2500, 2600), 2, 100, 1201},
		{"not a run: too far apart", slots(0, 1500), 2, 100, 100},
		{"unsorted", slots(50, 0), 2, 100, 1001},
	} {
		if got := sluicetest.EarliestFit(c.slots, c.limit, time.Second, at(c.from)); !got.Equal(at(c.want)) {
			t.Errorf("%s: EarliestFit = +%v, want +%d ms", c.name, got.Sub(at(0)), c.want)
		}
	}
}

// Client gives one test one client, of its own transport, and another test
// another.
func TestClientPerTest(t *testing.T) {
	var first *http.Client
	t.Run("a", func(t *testing.T) {
		first = sluicetest.Client(t)
		if sluicetest.Client(t) != first {
			t.Fatal("two clients for one test")
		}
		if first.Transport == http.DefaultTransport {
			t.Fatal("the default transport")
		}
	})
	t.Run("b", func(t *testing.T) {
		if sluicetest.Client(t) == first {
			t.Fatal("a second test got the first one's client")
		}
	})
}
