package redistest_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/tlstest"
)

// A TLS server answers a client that trusts its CA, and nothing on plain TCP.
func TestStartTLS(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	s := redistest.StartTLS(t, certs)
	ctx := context.Background()
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("TLS ping: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a plain-TCP client got an answer from the TLS-only server")
	}
	if got := s.URL(); got != "rediss://"+s.Addr {
		t.Errorf("URL = %q", got)
	}
}

// A TLS cluster forms over its TLS cluster bus and serves every master over
// TLS, with no plain port open.
func TestTLSCluster(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	cl, cc := redistest.NewTLSCluster(t, certs, 3, 0)
	ctx := context.Background()
	// a, b and c hash to slots 15495, 3300 and 7365: one on each master.
	for _, k := range []string{"a", "b", "c"} {
		if err := cc.Set(ctx, k, "1", 0).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
	for _, n := range cl.Nodes {
		got, err := n.Client(t).ConfigGet(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got["tls-cluster"] != "yes" || got["tls-replication"] != "yes" || got["port"] != "0" {
			t.Errorf("node %s: tls-cluster=%s tls-replication=%s port=%s", n.Addr, got["tls-cluster"], got["tls-replication"], got["port"])
		}
	}
}
