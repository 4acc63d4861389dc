package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

func TestLayoutNamesAndParse(t *testing.T) {
	t.Parallel()
	l := tasks.Layout{Base: "notifications", Shards: 4}
	if got := l.Queue(tasks.LaneStandard, 3); !strings.HasPrefix(got, "notifications.standard.3") {
		t.Fatalf("Queue = %q", got)
	}
	all := l.Queues()
	if len(all) != 3*4+1 || !strings.HasPrefix(all[0], "notifications.priority.0") || all[len(all)-1] != "notifications" {
		t.Fatalf("Queues = %v", all)
	}
	seen := map[string]bool{}
	for _, q := range all[:len(all)-1] {
		lane, shard, ok := l.Parse(q)
		if !ok || l.Queue(lane, shard) != q {
			t.Fatalf("Parse(%q) = %v %d %v", q, lane, shard, ok)
		}
		if seen[q] {
			t.Fatalf("%q named twice", q)
		}
		seen[q] = true
	}
	for _, q := range []string{"notifications", "notifications.standard.4", "notifications.standard.01", "notifications.urgent.0", "notifications.standard.3",
		"other.standard.0", "notifications.standard", "notifications.standard.-1", "notifications.standard.1.2"} {
		if _, _, ok := l.Parse(q); ok {
			t.Errorf("Parse(%q) ok, want not a queue of the layout", q)
		}
	}
	if got := (tasks.Layout{}).Route("acme", tasks.LanePriority, nil); got != tasks.DefaultLayout.Route("acme", tasks.LanePriority, nil) {
		t.Fatalf("zero layout routes to %q, not the default layout's", got)
	}
}

func TestLayoutValidate(t *testing.T) {
	t.Parallel()
	for _, l := range []tasks.Layout{{Shards: -1}, {Shards: tasks.MaxShards + 1}, {Base: "no spaces"}, {Base: "a{b}"}, {Base: string(make([]byte, 65))}} {
		if err := l.Validate(); !errors.Is(err, tasks.ErrLayout) {
			t.Errorf("Validate(%+v) = %v, want ErrLayout", l, err)
		}
	}
	if err := (tasks.Layout{Base: "sluice-prod.eu", Shards: 1}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestShardsSpreadTenants(t *testing.T) {
	t.Parallel()
	l := tasks.Layout{Shards: 8}
	counts := make([]int, 8)
	for i := 0; i < 8000; i++ {
		s := l.Shard(fmt.Sprintf("tenant-%d", i), nil)
		if s < 0 || s >= 8 {
			t.Fatalf("shard %d out of range", s)
		}
		counts[s]++
	}
	for s, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("shard %d holds %d of 8000 tenants, want about 1000: %v", s, c, counts)
		}
	}
	if l.Shard("acme", nil) != l.Shard("acme", nil) {
		t.Fatal("a tenant's shard is not stable")
	}
}

func TestPinsGiveATenantItsOwnShard(t *testing.T) {
	t.Parallel()
	l := tasks.Layout{Shards: 8}
	before := map[string]int{}
	for i := 0; i < 2000; i++ {
		name := fmt.Sprintf("t%d", i)
		before[name] = l.Shard(name, nil)
	}
	pinned := before["t7"] // pin t7 to the shard it already had, and "heavy" to shard 2
	pins := tasks.Pins{"t7": pinned, "heavy": 2, "outside": 99}
	moved := 0
	for name, was := range before {
		got := l.Shard(name, pins)
		if name == "t7" {
			if got != pinned {
				t.Fatalf("pinned tenant on shard %d, want %d", got, pinned)
			}
			continue
		}
		if got == pinned || got == 2 {
			t.Fatalf("tenant %s routed to pinned shard %d", name, got)
		}
		if got != was {
			moved++
			if was != pinned && was != 2 {
				t.Fatalf("tenant %s moved from unpinned shard %d to %d", name, was, got)
			}
		}
	}
	if moved == 0 {
		t.Fatal("no tenant left the pinned shards")
	}
	if got := l.Shard("heavy", pins); got != 2 {
		t.Fatalf("heavy on shard %d, want its pin 2", got)
	}
	// A pin outside the layout is ignored: "outside" hashes like anyone else.
	if got := l.Shard("outside", pins); got == 2 || got == pinned {
		t.Fatalf("out-of-range pin routed to a pinned shard %d", got)
	}
	// Every shard pinned: tenants without a pin share them all rather than none.
	all := tasks.Pins{}
	for s := 0; s < 8; s++ {
		all[fmt.Sprint("p", s)] = s
	}
	if s := l.Shard("newcomer", all); s < 0 || s >= 8 {
		t.Fatalf("shard %d", s)
	}
}

func TestDefaultLane(t *testing.T) {
	t.Parallel()
	for cat, want := range map[string]tasks.Lane{
		"otp": tasks.LanePriority, "fraud_alert": tasks.LanePriority, "marketing": tasks.LaneBulk, "newsletter": tasks.LaneBulk,
		"": tasks.LaneStandard, "default": tasks.LaneStandard, "transactional": tasks.LaneStandard, "receipt": tasks.LaneStandard,
	} {
		if got := tasks.DefaultLane(cat); got != want {
			t.Errorf("DefaultLane(%q) = %s, want %s", cat, got, want)
		}
	}
}

// Each shard's name hashes into its share of the Cluster's slots, so the
// shards of a lane spread evenly over the masters; the slot is the one a
// real cluster-enabled redis-server computes (CLUSTER KEYSLOT).
func TestShardNamesSpreadOverSlots(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	rdb := srv.Client(t)
	for _, q := range tasks.DefaultLayout.Queues() {
		got, err := rdb.ClusterKeySlot(context.Background(), "asynq:{"+q+"}:pending").Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(keyspace.Slot(q)); got != want {
			t.Fatalf("%s: Redis puts its keys in slot %d, the layout computed %d", q, got, want)
		}
	}
	for _, n := range []int{1, 3, 8, 16} {
		l := tasks.Layout{Shards: n}
		for _, lane := range tasks.Lanes {
			for i := 0; i < n; i++ {
				q := l.Queue(lane, i)
				slot := keyspace.Slot(q)
				if lo, hi := i*16384/n, (i+1)*16384/n; slot < lo || slot >= hi {
					t.Errorf("%d shards: %s hashes to slot %d, outside [%d, %d)", n, q, slot, lo, hi)
				}
				if got, shard, ok := l.Parse(q); !ok || got != lane || shard != i {
					t.Errorf("Parse(%q) = %v %d %v", q, got, shard, ok)
				}
			}
		}
	}
	// A suffix that does not belong to the shard's name is not a queue of the layout.
	l := tasks.Layout{Shards: 8}
	if _, _, ok := l.Parse(l.Queue(tasks.LaneStandard, 3) + "9"); ok {
		t.Fatal("a name with a foreign suffix parsed")
	}
}
