package sluicetest

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// LogBuffer collects what goroutines write to it — a logger's output,
// typically — and wakes a test waiting for what was written. The zero
// value is ready to use; it must not be copied after first use.
type LogBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed at the next Write, then replaced
}

// Write appends p and wakes every WaitFor.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.b.Write(p)
	if l.written != nil {
		close(l.written)
		l.written = nil
	}
	return n, err
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// next returns what was written so far and a channel closed at the next
// Write.
func (l *LogBuffer) next() (string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.written == nil {
		l.written = make(chan struct{})
	}
	return l.b.String(), l.written
}

// WaitFor checks cond against everything written so far, at once and after
// every Write, until it holds, and returns the text it held for. If it has
// not by timeout, it fails tb with "timed out after TIMEOUT waiting for
// WHAT" and the text. cond runs on the caller's goroutine.
func (l *LogBuffer) WaitFor(tb testing.TB, timeout time.Duration, what string, cond func(string) bool) string {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s, written := l.next()
		if cond(s) {
			return s
		}
		select {
		case <-written:
		case <-deadline.C:
			if s := l.String(); cond(s) {
				return s
			}
			tb.Fatalf("timed out after %v waiting for %s; written:\n%s", timeout, what, l.String())
		}
	}
}
