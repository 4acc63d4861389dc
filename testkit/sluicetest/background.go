package sluicetest

import (
	"context"
	"testing"
)

// Background runs run on a goroutine of its own until the test ends. The
// cleanup it registers cancels run's context, waits for run to return and
// fails the test with what's error, if any. Register it after what run
// needs (a redis-server, a fake) so that run stops first.
func Background(tb testing.TB, what string, run func(context.Context) error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("%s: %v", what, err)
		}
	})
}
