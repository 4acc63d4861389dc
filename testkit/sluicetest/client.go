package sluicetest

import (
	"net/http"
	"sync"
	"testing"
)

var clients sync.Map // testing.TB → *http.Client

// Client returns t's HTTP client: a transport of its own (the same one for
// every call in t), its idle connections closed when t ends. A test that
// POSTs over http.DefaultClient can fail when another test's
// httptest.Server.Close closes http.DefaultTransport's idle connections at
// the moment its request takes one: net/http retries only idempotent
// requests on such a connection, so the POST ends in an EOF.
func Client(t testing.TB) *http.Client {
	if c, ok := clients.Load(t); ok {
		return c.(*http.Client)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	c := &http.Client{Transport: tr}
	if prev, loaded := clients.LoadOrStore(t, c); loaded {
		return prev.(*http.Client)
	}
	t.Cleanup(func() {
		clients.Delete(t)
		tr.CloseIdleConnections()
	})
	return c
}
