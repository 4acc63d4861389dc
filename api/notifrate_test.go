package api_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/testkit/apienv"
)

func smsBatch(n int) map[string]any {
	var items []any
	for i := range n {
		items = append(items, apienv.NewSMS(fmt.Sprintf("+1415555%04d", i), "batch"))
	}
	return map[string]any{"notifications": items}
}

// The rate counts notifications, not requests: under 600/1m a batch of
// 500 passes, a batch of 200 then gets 429 with Retry-After and nothing
// enqueued, a batch of 100 still fits; another token has its own.
func TestNotificationRateCountsNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_API_NOTIFICATION_RATE": "600/1m"})
	tok := b.Tokens["acme"]
	if r := b.Do(t, "POST", "/v1/notifications", tok, smsBatch(500)); r.Status != 202 {
		t.Fatalf("500: %d %s", r.Status, r.Body)
	}
	r := b.Do(t, "POST", "/v1/notifications", tok, smsBatch(200))
	if r.Status != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" || r.Problem(t).Type != api.ProblemBase+"rate-limited" {
		t.Fatalf("200 more: %d %v %s", r.Status, r.Header, r.Body)
	}
	if n := len(b.Queued(t)); n != 500 {
		t.Fatalf("%d queued after the refusal, want 500", n)
	}
	if r := b.Do(t, "POST", "/v1/notifications", tok, smsBatch(100)); r.Status != 202 {
		t.Fatalf("100 more: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], smsBatch(500)); r.Status != 202 {
		t.Fatalf("another token: %d %s", r.Status, r.Body)
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
			r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], smsBatch(50))
			mu.Lock()
			codes[r.Status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[202] != 12 || codes[429] != 8 {
		t.Fatalf("20 batches of 50 under 600/1m: %v, want 12 × 202, 8 × 429", codes)
	}
}
