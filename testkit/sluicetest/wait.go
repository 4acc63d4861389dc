// Package sluicetest holds what Sluice's tests share and that needs nothing
// of Sluice: waiting for a condition that nothing signals, and a log sink
// that goroutines write to and a test waits on.
//
// It imports the standard library only, so the tests of every package —
// internal tests included — can use it without an import cycle. The API
// process as tests run it is in the subpackage apienv.
//
// Prefer a signal where one exists (a channel, a callback, a hook, the
// fakes' WaitFor, LogBuffer.WaitFor); Eventually is for state that changes
// without telling anyone: a Redis key, Asynq's view of a queue, a status
// read over HTTP.
package sluicetest

import (
	"fmt"
	"testing"
	"time"
)

// Tick is how often Eventually, EventuallyValue and Wait check their
// condition.
const Tick = 20 * time.Millisecond

// Eventually checks cond at once and then every Tick until it returns
// true. If it has not by timeout, it fails tb with "timed out after
// TIMEOUT waiting for WHAT". cond runs on the caller's goroutine, so it may
// fail tb itself.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	EventuallyEvery(tb, timeout, Tick, what, cond)
}

// EventuallyEvery is Eventually checking every tick instead of every
// Tick: for a condition costly to check (a scan of every queue, a request
// to a process) while what it checks is being measured.
func EventuallyEvery(tb testing.TB, timeout, tick time.Duration, what string, cond func() bool) {
	tb.Helper()
	if err := wait(timeout, tick, what, cond); err != nil {
		tb.Fatal(err)
	}
}

// EventuallyValue calls get at once and then every Tick until it reports
// ok, and returns the value it returned then. If it has not by timeout, it
// fails tb with "timed out after TIMEOUT waiting for WHAT; last: VALUE",
// the last value get returned (formatted with %+v), so the failure shows
// how far things got.
func EventuallyValue[T any](tb testing.TB, timeout time.Duration, what string, get func() (T, bool)) T {
	tb.Helper()
	return EventuallyValueEvery(tb, timeout, Tick, what, get)
}

// EventuallyValueEvery is EventuallyValue calling get every tick instead
// of every Tick (see EventuallyEvery).
func EventuallyValueEvery[T any](tb testing.TB, timeout, tick time.Duration, what string, get func() (T, bool)) T {
	tb.Helper()
	var last T
	err := wait(timeout, tick, what, func() bool {
		v, ok := get()
		last = v
		return ok
	})
	if err != nil {
		tb.Fatalf("%v; last: %+v", err, last)
	}
	return last
}

// Wait is Eventually for a goroutine other than the test's, where tb.Fatal
// must not be called: it returns nil as soon as cond holds, or, if it has
// not by timeout, an error "timed out after TIMEOUT waiting for WHAT".
func Wait(timeout time.Duration, what string, cond func() bool) error {
	return wait(timeout, Tick, what, cond)
}

// wait checks cond at once, every tick, and once more when timeout passes.
func wait(timeout, tick time.Duration, what string, cond func() bool) error {
	if cond() {
		return nil
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			if cond() {
				return nil
			}
		case <-deadline.C:
			if cond() {
				return nil
			}
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
	}
}
