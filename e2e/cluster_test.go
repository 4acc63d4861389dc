package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Workers and limiter on a 3-master Redis Cluster with one replica each.
// Mid-run the master holding the queue is killed; its replica takes over,
// workers follow, nothing is lost and no recipient's window is exceeded.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=3/2s,sms:tenant=100000/1h")
	cl, cc := e.onCluster(1)
	e.worker("w0", nil)
	e.worker("w1", nil)
	ctx := context.Background()
	ids := map[string]string{}
	tenants := []string{"t-a", "t-b", "t-c", "t-d"}
	rcpts := recipients(4)
	for i := 0; i < 80; i++ {
		n := tasks.NewSMS(tenants[i%4], rcpts[i%4], "cluster")
		if _, err := tasks.Enqueue(ctx, e.client, e.keys, n); err != nil {
			t.Fatal(err)
		}
		ids[n.ID] = n.To
	}
	e.sms.WaitCount(t, 20, time.Minute)
	master, err := cc.MasterForKey(ctx, "asynq:{"+tasks.DefaultLayout.Route("t-a", tasks.LaneStandard, nil)+"}:pending")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cl.Nodes {
		if s.Addr == master.Options().Addr {
			s.Stop()
		}
	}
	cl.WaitHealthy(t, cc)
	ds := e.waitAllDelivered(ids, 3*time.Minute)
	r := audit(ds, 3, 2*time.Second, byRecipient)
	t.Logf("cluster failover of the queue's master: %d receipts, %d lost, %d repeats, %d violations", r.receipts, len(ids)-r.delivered, r.duplicates, r.violations)
	if r.violations != 0 {
		t.Fatalf("window exceeded: %s", r.worst)
	}
	// The limiter's keys of one tenant share a slot on the cluster.
	lim, _ := throttle.New(cc, throttle.Options{Secret: []byte(secret), CompactMembers: true})
	if _, err := lim.Usage(ctx, "t-a", 0, throttle.Limit{Scope: "sms:recipient", Subject: rcpts[0], Rule: throttle.Rule{Limit: 3, Window: 2 * time.Second}},
		throttle.Limit{Scope: "sms:tenant", Rule: throttle.PerHour(100000)}); err != nil {
		t.Fatal(err)
	}
}
