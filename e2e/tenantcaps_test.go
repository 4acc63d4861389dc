package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

func usedMemory(t *testing.T, e *env) int64 {
	t.Helper()
	info, err := e.rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO")
	return 0
}

func smsBatch(from, n int, body string) string {
	var b strings.Builder
	b.WriteString(`{"notifications":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(smsJSON(fmt.Sprintf("+1415%07d", from+i), body))
	}
	b.WriteString("]}")
	return b.String()
}

// A tenant at its cap of queued notifications gets 429 queue-full with
// Retry-After and nothing of the request is enqueued, while another
// tenant enqueues and is sent; the Redis memory the full tenant holds is
// within its byte cap; once a worker sent its notifications the tenant
// may enqueue again (the worker took them out of the count).
func TestTenantQueuedCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=100/1s,sms:tenant=100000/1h")
	const capN = 1000
	// A notification as the API stores it (an id, enqueued_at) counts
	// about 1,790 B: the byte cap lets the count cap bind first.
	capBytes := int64(capN) * 1900
	a := e.startAPI(map[string]string{"SLUICE_API_RATE": "1000/1s", "SLUICE_API_NOTIFICATION_RATE": "100000/1s",
		"SLUICE_TENANT_MAX_QUEUED": strconv.Itoa(capN), "SLUICE_TENANT_MAX_QUEUED_BYTES": strconv.FormatInt(capBytes, 10)}, "acme", "globex")
	acme, globex := a.tokens["acme"], a.tokens["globex"]
	before := usedMemory(t, e)

	for b := range 2 {
		if r := a.call("POST", "/v1/notifications", acme, smsBatch(b*500, 500, "your order shipped")); r.Status != 202 {
			t.Fatalf("batch %d: %d %s", b, r.Status, r.Body)
		}
	}
	held := usedMemory(t, e) - before
	counted, err := tasks.NewQueueQuota(e.rdb, tasks.Caps{TTL: time.Hour}).Usage(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1000 queued SMS hold %d B of Redis (%d B each), counted as %d B (%d B each); byte cap %d B", held, held/capN,
		counted.Bytes, counted.Bytes/capN, capBytes)
	// The count bounds what Redis holds, and the cap bounds the count.
	if held > counted.Bytes || counted.Bytes > capBytes {
		t.Fatalf("the tenant holds %d B of Redis, counted %d B, byte cap %d B", held, counted.Bytes, capBytes)
	}
	for _, body := range []string{smsBatch(1000, 500, "more"), smsJSON("+14159999999", "one more")} {
		r := a.call("POST", "/v1/notifications", acme, body)
		var p struct {
			Type       string `json:"type"`
			RetryAfter int    `json:"retry_after"`
		}
		r.JSON(t, &p)
		if r.Status != 429 || r.Header.Get("Retry-After") == "" || p.Type != "urn:sluice:problem:queue-full" {
			t.Fatalf("over the cap: %d Retry-After=%q %s", r.Status, r.Header.Get("Retry-After"), r.Body)
		}
	}
	// sluice enqueue is under the same cap.
	cli := exec.Command(sluiceBin, "enqueue", "sms", "--tenant", "acme", "--to", "+14158888888", "--text", "from the CLI")
	cli.Env = e.environ(map[string]string{"SLUICE_TENANT_MAX_QUEUED": strconv.Itoa(capN), "SLUICE_TENANT_MAX_QUEUED_BYTES": strconv.FormatInt(capBytes, 10)})
	if out, err := cli.CombinedOutput(); err == nil || !strings.Contains(string(out), "do not fit") {
		t.Fatalf("sluice enqueue over the cap: %v\n%s", err, out)
	}
	if qi, err := e.queueInfo(); err != nil || qi.Size != capN {
		t.Fatalf("queued after the refusals: %+v %v, want exactly %d (nothing partial)", qi, err, capN)
	}

	// The other tenant is not refused, and is sent.
	ids := map[string]string{}
	for i := range 5 {
		r := a.call("POST", "/v1/notifications", globex, smsJSON(fmt.Sprintf("+1650555%04d", i), "globex"))
		if r.Status != 202 {
			t.Fatalf("globex: %d %s", r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		ids[acc.ID] = "globex"
	}
	e.worker("w0", nil)
	e.waitAllDelivered(ids, 60*time.Second)
	e.waitDrained(90 * time.Second)
	// The worker takes sent notifications out of the count in the
	// background, about a round trip after the send: wait for the count.
	quota := tasks.NewQueueQuota(e.rdb, tasks.Caps{TTL: time.Hour})
	// The count has no change signal: poll.
	type usage struct {
		Usage tasks.QueuedUsage
		Err   error
	}
	sluicetest.EventuallyValue(t, 10*time.Second, "acme's queued count to be 0 after the drain", func() (usage, bool) {
		u, err := quota.Usage(context.Background(), "acme")
		return usage{u, err}, err == nil && u.Notifications == 0
	})

	// Sent notifications no longer count: acme may enqueue again.
	if r := a.call("POST", "/v1/notifications", acme, smsBatch(5000, 500, "again")); r.Status != 202 {
		t.Fatalf("after the queue drained: %d %s", r.Status, r.Body)
	}
}
