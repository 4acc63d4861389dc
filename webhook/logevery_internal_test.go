package webhook

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// 100 refused signatures at once log one WARN; the next line, once the
// interval passed, says how many were not logged.
func TestRepeatedWarnsAreBounded(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	s := NewLogEvery(time.Hour)
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() { defer wg.Done(); s.Warn(log, "refused", "route", "x") }()
	}
	wg.Wait()
	if n := strings.Count(buf.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d WARN lines for 100 refusals within the interval, want 1:\n%s", n, buf.String())
	}
	s.mu.Lock()
	s.last = time.Now().Add(-2 * time.Hour) // the interval passed
	s.mu.Unlock()
	s.Warn(log, "refused", "route", "x")
	if n := strings.Count(buf.String(), "level=WARN"); n != 2 || !strings.Contains(buf.String(), "not_logged_since_last=99") {
		t.Fatalf("after the interval: %d lines:\n%s", n, buf.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
