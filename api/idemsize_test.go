package api_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/testkit/apienv"
)

// The record of a 500-notification batch's Idempotency-Key is at most
// 1 KB of Redis (MEMORY USAGE), and its replays are the first answer byte
// for byte: the same ids and states; so is a single notification's, with
// its Location.
func TestIdempotencyRecordSize(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.Tokens["acme"]
	var items []any
	for i := range api.MaxBatch {
		items = append(items, apienv.NewSMS(fmt.Sprintf("+1415555%04d", i), "your code"))
	}
	body := map[string]any{"notifications": items}
	first := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "big-batch")
	if first.Status != 202 {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	size, err := b.RDB.MemoryUsage(context.Background(), api.IdempotencyRedisKey("acme", "big-batch")).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("record of a %d-notification batch: %d B (MEMORY USAGE); the answer is %d B", api.MaxBatch, size, len(first.Body))
	if size > 1024 {
		t.Fatalf("record of a 500-notification batch is %d B, over 1 KB", size)
	}
	for range 2 {
		again := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "big-batch")
		if again.Status != 202 || again.Header.Get(api.HeaderReplayed) != "true" || string(again.Body) != string(first.Body) {
			t.Fatalf("replay differs: %d %v\n%.300s\nwant\n%.300s", again.Status, again.Header, again.Body, first.Body)
		}
	}
	// Mixed states (one sent already when the answer was made) replay as answered.
	mixed := map[string]any{"notifications": []any{apienv.NewSMS("+14155550200", "a"), apienv.NewSMS("+14155550201", "b")}}
	markSent(t, b, "acme", api.NotificationID("acme", "mixed", 0))
	m1 := b.Do(t, "POST", "/v1/notifications", tok, mixed, "Idempotency-Key", "mixed")
	m2 := b.Do(t, "POST", "/v1/notifications", tok, mixed, "Idempotency-Key", "mixed")
	var ma api.BatchAccepted
	m1.JSON(t, &ma)
	if m1.Status != 202 || ma.Notifications[0].State != api.StateSent || ma.Notifications[1].State != api.StateQueued ||
		m2.Header.Get(api.HeaderReplayed) != "true" || string(m2.Body) != string(m1.Body) {
		t.Fatalf("mixed states: %s, replayed %q %s", m1.Body, m2.Header.Get(api.HeaderReplayed), m2.Body)
	}
	one := b.Do(t, "POST", "/v1/notifications", tok, apienv.NewSMS("+14155550999", "single"), "Idempotency-Key", "single")
	re := b.Do(t, "POST", "/v1/notifications", tok, apienv.NewSMS("+14155550999", "single"), "Idempotency-Key", "single")
	if one.Status != 202 || re.Status != 202 || string(re.Body) != string(one.Body) || re.Header.Get("Location") != one.Header.Get("Location") ||
		re.Header.Get("Location") != "/v1/notifications/"+api.NotificationID("acme", "single", 0) {
		t.Fatalf("single replay: %d %s %q, first %d %s %q", re.Status, re.Body, re.Header.Get("Location"), one.Status, one.Body, one.Header.Get("Location"))
	}
}
