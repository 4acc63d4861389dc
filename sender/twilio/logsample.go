package twilio

import (
	"log/slog"
	"sync"
	"time"
)

// warnEvery logs one WARN per interval for a repeated event (a refused
// signature: anyone can send them, and one line each would let them fill
// the log), naming how many were not logged since the last line.
type warnEvery struct {
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
	skipped  int
}

// warn logs msg unless one was logged less than interval ago.
func (s *warnEvery) warn(log *slog.Logger, msg string, args ...any) {
	s.mu.Lock()
	now := time.Now()
	if !s.last.IsZero() && now.Sub(s.last) < s.interval {
		s.skipped++
		s.mu.Unlock()
		return
	}
	skipped := s.skipped
	s.last, s.skipped = now, 0
	s.mu.Unlock()
	log.Warn(msg, append(args, "not_logged_since_last", skipped, "logged_at_most_every", s.interval)...)
}
