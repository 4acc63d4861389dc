package sluicetest

import (
	"bytes"
	"strings"
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

// Tail returns the last n lines written (all of them when fewer).
func (l *LogBuffer) Tail(n int) string {
	s := strings.TrimSuffix(l.String(), "\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// FailureLog returns a LogBuffer for a component's log whose last tail
// lines are written to t's output only if t fails, after the failure's own
// messages: a failed test's reason comes first, not after thousands of log
// lines (CI shows the head and the end of a failure's output).
func FailureLog(t testing.TB, tail int) *LogBuffer {
	l := &LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last %d lines of the log:\n%s", tail, l.Tail(tail))
		}
	})
	return l
}
