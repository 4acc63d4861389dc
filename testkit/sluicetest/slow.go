package sluicetest

import "testing"

// Slow marks a test that takes seconds (it waits for windows, workers,
// failovers or a browser): -short, the contributor's loop (`go test -short
// ./...`, `./scripts/test.sh --quick`), skips it, saying so; the full
// suite, which CI runs, runs every one.
func Slow(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow: not run with -short (./scripts/test.sh runs it)")
	}
}
