package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lifecycle"
)

// recorder notes the order parts start and stop in.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) note(s string) { r.mu.Lock(); r.events = append(r.events, s); r.mu.Unlock() }

func (r *recorder) part(name string, startErr error) lifecycle.Part {
	return lifecycle.Func(name,
		func(context.Context) error {
			if startErr != nil {
				r.note("fail " + name)
				return startErr
			}
			r.note("start " + name)
			return nil
		},
		func(context.Context) error { r.note("stop " + name); return nil })
}

var quiet = slog.New(slog.DiscardHandler)

func TestRunStartsInOrderAndStopsInReverse(t *testing.T) {
	t.Parallel()
	var r recorder
	ctx, cancel := context.WithCancel(context.Background())
	done, started := make(chan error, 1), make(chan struct{})
	last := lifecycle.Func("started", func(context.Context) error { close(started); return nil }, nil)
	go func() { done <- lifecycle.Run(ctx, quiet, r.part("a", nil), r.part("b", nil), r.part("c", nil), last) }()
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}

func TestAFailedStartStopsWhatStarted(t *testing.T) {
	t.Parallel()
	var r recorder
	boom := errors.New("boom")
	err := lifecycle.Run(context.Background(), quiet, r.part("a", nil), r.part("b", nil), r.part("c", boom), r.part("d", nil))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "start c") {
		t.Fatalf("err %v, want start c: boom", err)
	}
	want := []string{"start a", "start b", "fail c", "stop b", "stop a"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}

// A Go part's function runs until its Stop, not until the process's
// context ends: the parts after it stop first.
func TestGoRunsUntilItsStop(t *testing.T) {
	t.Parallel()
	var r recorder
	ctx, cancel := context.WithCancel(context.Background())
	running := make(chan struct{})
	loop := lifecycle.Go("loop", func(ctx context.Context) {
		close(running)
		<-ctx.Done()
		r.note("loop ended")
	})
	done := make(chan error, 1)
	go func() { done <- lifecycle.Run(ctx, quiet, loop, r.part("after", nil)) }()
	<-running
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := []string{"start after", "stop after", "loop ended"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}

// A server whose listener breaks fails the run: every part stops and Run
// returns the error.
func TestAFailedServerEndsTheRun(t *testing.T) {
	t.Parallel()
	var r recorder
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	done := make(chan error, 1)
	go func() {
		done <- lifecycle.Run(context.Background(), quiet, r.part("before", nil), lifecycle.Serve("http", srv, ln, time.Second))
	}()
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ln.Close() // the listener breaks under the server
	err = <-done
	if err == nil || !strings.Contains(err.Error(), "http") {
		t.Fatalf("err %v, want the server's failure", err)
	}
	if want := []string{"start before", "stop before"}; !slices.Equal(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}
