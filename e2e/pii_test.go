package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// After a mixed run — sent, throttled and waiting, scheduled for later,
// refused by the provider (its error naming the number) and archived — no
// key and no value in Redis, Asynq's included, holds a recipient, a body or
// a subject in clear.
func TestNoPIIAtRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=1/1h,sms:tenant=1000/1h")
	const refused = "+14155557777"
	e.sms.SetReply(func(to, _ string) (int, string) {
		if to == refused {
			return 400, "" // the fake's error body is generic; the worker's own error names the call
		}
		return 0, ""
	})
	w := e.worker("w0", map[string]string{"SLUICE_LOG_LEVEL": "debug"})
	var secrets []string
	add := func(n tasks.Notification, opts ...asynq.Option) {
		secrets = append(secrets, n.To, n.Body)
		if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, n, opts...); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		to := fmt.Sprintf("+141555571%02d", i)
		add(tasks.NewSMS("acme", to, fmt.Sprintf("secret-body-sent-%d code 4%05d", i, i)))
		add(tasks.NewSMS("acme", to, fmt.Sprintf("secret-body-waiting-%d code 5%05d", i, i))) // throttled: 1/1h
	}
	add(tasks.NewSMS("acme", "+14155557200", "secret-body-later code 600000"), asynq.ProcessIn(time.Hour))
	add(tasks.NewSMS("acme", refused, "secret-body-refused code 700000"))
	e.sms.WaitCount(t, 5, 30*time.Second)
	// Asynq offers no signal for a settled queue.
	sluicetest.EventuallyValueEvery(t, 20*time.Second, 50*time.Millisecond, "the queue to settle (1 archived, 6 waiting, none active)", func() (queueRead, bool) {
		qi, err := e.queueInfo()
		return queueRead{qi, err}, err == nil && qi.Archived == 1 && qi.Retry+qi.Scheduled == 6 && qi.Active == 0
	})
	ctx := context.Background()
	var keys []string
	iter := e.rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) < 10 {
		t.Fatalf("only %d keys: the scan saw nothing", len(keys))
	}
	var values int
	for _, k := range keys {
		var blobs []string
		switch e.rdb.Type(ctx, k).Val() {
		case "string":
			blobs = []string{e.rdb.Get(ctx, k).Val()}
		case "hash":
			for f, v := range e.rdb.HGetAll(ctx, k).Val() {
				blobs = append(blobs, f, v)
			}
		case "list":
			blobs = e.rdb.LRange(ctx, k, 0, -1).Val()
		case "set":
			blobs = e.rdb.SMembers(ctx, k).Val()
		case "zset":
			blobs = e.rdb.ZRange(ctx, k, 0, -1).Val()
		}
		blobs = append(blobs, k)
		for _, b := range blobs {
			values++
			for _, s := range secrets {
				if strings.Contains(b, s) || strings.Contains(b, strings.TrimPrefix(s, "+")) {
					t.Errorf("key %q holds %q in clear", k, s)
				}
			}
			// Every number here begins +1 415 555 7: its digits from the
			// area code on, in any format that keeps them together. (The
			// four digits 5557 alone matched a hex notification id,
			// 01a240c2…c55573a…, in a full run.)
			if strings.Contains(b, "secret-body") || strings.Contains(b, "4155557") {
				t.Errorf("key %q holds personal data in clear: %.120q", k, b)
			}
		}
	}
	if log := w.logText(); strings.Contains(log, "4155557") || strings.Contains(log, "secret-body") {
		t.Errorf("the worker's log shows a number or a body in clear")
	}
	t.Logf("scanned %d keys, %d values: no recipient, body or subject in clear", len(keys), values)
}
