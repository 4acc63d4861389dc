// Package lifecycle gives every background part of a Sluice process one
// shape — Start, then Stop — and runs a list of them: started in order,
// stopped in reverse, with one error path. (Asynq's server starts its
// components and stops them in one list the same way; River calls it
// startstop.)
//
// A process is its list:
//
//	err := lifecycle.Run(ctx, log,
//		lifecycle.Func("redis", ping, nil),      // fails fast: nothing after it starts
//		lifecycle.Go("queue-gate", gate.Run),     // a loop that runs until stopped
//		lifecycle.Serve("http", srv, ln, 5*time.Second),
//		servers,                                   // any value with Name, Start and Stop
//	)
//
// A part that fails to start stops the parts started before it, in
// reverse, and Run returns its error; a part that fails while running
// (Failed) ends the run the same way as the end of ctx does.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Part is one background part of a process.
type Part interface {
	// Name says what the part is, in logs and errors.
	Name() string
	// Start begins the part's work and returns once it runs. An error
	// means it did not start and holds nothing. The context is the
	// process's: a part must not end its work when it ends, only when
	// Stop is called (the parts after it may still need it).
	Start(ctx context.Context) error
	// Stop ends the part's work and returns once it has ended, or when
	// ctx ends (then with an error).
	Stop(ctx context.Context) error
}

// Failer is a Part that can fail while it runs (a server whose listener
// broke): Run stops the process when Failed delivers an error.
type Failer interface {
	Failed() <-chan error
}

// StopTimeout bounds each part's Stop in Run.
const StopTimeout = time.Minute

// Run starts parts in order, waits until ctx ends or a running part
// fails, then stops every started part in reverse order. It returns the
// error a part failed to start or run with (naming it), joined with the
// errors of the Stops.
func Run(ctx context.Context, log *slog.Logger, parts ...Part) error {
	stop, err := Start(ctx, parts...)
	if err != nil {
		return err
	}
	failed, quit := make(chan error, 1), make(chan struct{})
	defer close(quit)
	for _, p := range parts {
		if f, ok := p.(Failer); ok {
			go func() {
				select {
				case err := <-f.Failed():
					select {
					case failed <- fmt.Errorf("%s: %w", p.Name(), err):
					default:
					}
				case <-quit:
				}
			}()
		}
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-failed:
		log.Error("a part failed; stopping", "err", runErr)
	}
	return errors.Join(runErr, stop(context.Background()))
}

// Start starts parts in order and returns the function that stops them in
// reverse. If one fails to start, those started before it are stopped, in
// reverse, and Start returns its error.
func Start(ctx context.Context, parts ...Part) (stop func(context.Context) error, err error) {
	started := 0
	stop = func(ctx context.Context) error {
		var errs []error
		for i := started - 1; i >= 0; i-- {
			sctx, cancel := context.WithTimeout(ctx, StopTimeout)
			if err := parts[i].Stop(sctx); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", parts[i].Name(), err))
			}
			cancel()
		}
		return errors.Join(errs...)
	}
	for _, p := range parts {
		if err := p.Start(ctx); err != nil {
			return nil, errors.Join(fmt.Errorf("start %s: %w", p.Name(), err), stop(context.WithoutCancel(ctx)))
		}
		started++
	}
	return stop, nil
}

// Func is a part made of two functions; either may be nil.
func Func(name string, start, stop func(context.Context) error) Part {
	return funcPart{name, start, stop}
}

type funcPart struct {
	name        string
	start, stop func(context.Context) error
}

func (f funcPart) Name() string { return f.name }

func (f funcPart) Start(ctx context.Context) error {
	if f.start == nil {
		return nil
	}
	return f.start(ctx)
}

func (f funcPart) Stop(ctx context.Context) error {
	if f.stop == nil {
		return nil
	}
	return f.stop(ctx)
}

// Go is a part that runs fn in a goroutine from Start until Stop cancels
// fn's context; Stop returns once fn has returned. fn's context is not
// the process's: it ends at Stop, in the list's order.
func Go(name string, fn func(context.Context)) Part {
	return &goPart{name: name, fn: fn}
}

type goPart struct {
	name   string
	fn     func(context.Context)
	cancel context.CancelFunc
	done   chan struct{}
}

func (g *goPart) Name() string { return g.name }

func (g *goPart) Start(ctx context.Context) error {
	ctx, g.cancel = context.WithCancel(context.WithoutCancel(ctx))
	g.done = make(chan struct{})
	go func() {
		defer close(g.done)
		g.fn(ctx)
	}()
	return nil
}

func (g *goPart) Stop(ctx context.Context) error {
	g.cancel()
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("still running: %w", ctx.Err())
	}
}

// Serve is a part that serves srv on ln from Start; Stop shuts it down
// gracefully, waiting at most grace for the requests in flight before it
// closes the connections left. A listener that breaks while serving fails
// the part (Failed).
func Serve(name string, srv *http.Server, ln net.Listener, grace time.Duration) Part {
	return &servePart{name: name, srv: srv, ln: ln, grace: grace, failed: make(chan error, 1)}
}

type servePart struct {
	name   string
	srv    *http.Server
	ln     net.Listener
	grace  time.Duration
	failed chan error
	once   sync.Once
}

func (s *servePart) Name() string { return s.name }

func (s *servePart) Start(context.Context) error {
	go func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.failed <- fmt.Errorf("serve %s: %w", s.ln.Addr(), err)
		}
	}()
	return nil
}

func (s *servePart) Failed() <-chan error { return s.failed }

func (s *servePart) Stop(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		sctx, cancel := context.WithTimeout(ctx, s.grace)
		defer cancel()
		if err = s.srv.Shutdown(sctx); err != nil {
			_ = s.srv.Close()
			err = fmt.Errorf("requests still in flight after %v: %w", s.grace, err)
		}
	})
	return err
}
