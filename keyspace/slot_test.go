package keyspace_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// Slot is the slot a cluster-enabled redis-server computes (CLUSTER
// KEYSLOT) for keys of every shape Sluice writes: tenants' groups (escaped:
// braces in a tenant), a queue's name, names InShare makes.
func TestSlotIsRedisCluster(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	rdb := srv.Client(t)
	tags := []string{"acme", "globex", "hold", "héllo", keyspace.HashTag("a{b}c"), keyspace.HashTag("t-{x}"), "notifications.standard.3"}
	for i := range 12 {
		tags = append(tags, keyspace.InShare("acme~", i, 12))
	}
	for _, tag := range tags {
		got, err := rdb.ClusterKeySlot(context.Background(), "sl1:{"+tag+"}:x").Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := keyspace.Slot(tag); int(got) != want {
			t.Errorf("%q: Redis puts its keys in slot %d, Slot says %d", tag, got, want)
		}
	}
}

// InShare's names fall in their share of the slot space, for every share
// count, and a name already in its share is kept.
func TestInShare(t *testing.T) {
	for _, n := range []int{1, 2, 3, 6, 16, 64} {
		for i := range n {
			name := keyspace.InShare(fmt.Sprintf("acme~%d", i), i, n)
			if s, lo, hi := keyspace.Slot(name), i*keyspace.Slots/n, (i+1)*keyspace.Slots/n; s < lo || s >= hi {
				t.Errorf("%d shares: %q in slot %d, outside [%d, %d)", n, name, s, lo, hi)
			}
		}
	}
	if got := keyspace.InShare("acme", 0, 1); got != "acme" {
		t.Fatalf("InShare kept nothing of a name already in its share: %q", got)
	}
}
