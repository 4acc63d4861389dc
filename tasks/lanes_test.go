package tasks_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/tasks"
)

func TestLayoutNamesAndParse(t *testing.T) {
	t.Parallel()
	l := tasks.Layout{Base: "notifications", Shards: 4}
	if got := l.Queue(tasks.LaneStandard, 3); got != "notifications.standard.3" {
		t.Fatalf("Queue = %q", got)
	}
	all := l.Queues()
	if len(all) != 3*4+1 || all[0] != "notifications.priority.0" || all[len(all)-1] != "notifications" {
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
	for _, q := range []string{"notifications", "notifications.standard.4", "notifications.standard.01", "notifications.urgent.0",
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
