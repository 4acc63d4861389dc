package throttle_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// On a 3-master Redis Cluster, a multi-rule check of one group routes to one
// slot (one script, no CROSSSLOT), groups spread over the masters, and the
// limits stay exact under concurrent load.
func TestCluster(t *testing.T) {
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	l, err := throttle.New(cc, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	masters := map[string]bool{}
	for g := 0; g < 12; g++ {
		group := fmt.Sprintf("tenant-%d", g)
		limits := []throttle.Limit{
			{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 5, Window: time.Minute}},
			{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 20, Window: 24 * time.Hour}},
			{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 100, Window: time.Hour}},
		}
		slot := int64(-1)
		for _, lim := range limits {
			k, _ := l.Key(group, lim)
			s, err := cc.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("group %s: keys in slots %d and %d", group, slot, s)
			}
			slot = s
		}
		k, _ := l.Key(group, limits[2])
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true

		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 2; j++ {
					d, err := l.Allow(ctx, group, uuid.NewString(), limits...)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 5 {
			t.Fatalf("group %s: admitted %d on the cluster, want 5", group, admitted.Load())
		}
	}
	if len(masters) < 2 {
		t.Fatalf("12 groups all landed on %d master(s); hash tags are not spreading groups", len(masters))
	}
}

// The booking path on a Cluster: the model trials run against a 3-master
// Cluster client, each trial's group on its own slot.
func TestReserveMatchesModelOnCluster(t *testing.T) {
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 16))
	for trial := 0; trial < 30; trial++ {
		runModelTrial(t, cc, rng, trial)
	}
}
