package api_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/api"
)

func smsBatch(n int) map[string]any {
	var items []any
	for i := range n {
		items = append(items, sms(fmt.Sprintf("+1415555%04d", i), "batch"))
	}
	return map[string]any{"notifications": items}
}

// The rate counts notifications, not requests: under 600/1m a batch of
// 500 passes, a batch of 200 then gets 429 with Retry-After and nothing
// enqueued, a batch of 100 still fits; another token has its own.
func TestNotificationRateCountsNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_API_NOTIFICATION_RATE": "600/1m"})
	tok := b.tokens["acme"]
	if r := b.do(t, "POST", "/v1/notifications", tok, smsBatch(500)); r.status != 202 {
		t.Fatalf("500: %d %s", r.status, r.body)
	}
	r := b.do(t, "POST", "/v1/notifications", tok, smsBatch(200))
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || r.problem(t).Type != api.ProblemBase+"rate-limited" {
		t.Fatalf("200 more: %d %v %s", r.status, r.header, r.body)
	}
	if n := len(b.queued(t)); n != 500 {
		t.Fatalf("%d queued after the refusal, want 500", n)
	}
	if r := b.do(t, "POST", "/v1/notifications", tok, smsBatch(100)); r.status != 202 {
		t.Fatalf("100 more: %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/notifications", b.tokens["globex"], smsBatch(500)); r.status != 202 {
		t.Fatalf("another token: %d %s", r.status, r.body)
	}
}

// Concurrent batches never exceed the notification rate: exactly the
// batches that fit are accepted.
func TestNotificationRateConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_API_NOTIFICATION_RATE": "600/1m"})
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.do(t, "POST", "/v1/notifications", b.tokens["acme"], smsBatch(50))
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[202] != 12 || codes[429] != 8 {
		t.Fatalf("20 batches of 50 under 600/1m: %v, want 12 × 202, 8 × 429", codes)
	}
}
