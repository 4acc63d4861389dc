package api_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/api"
)

// The record of a 500-notification batch's Idempotency-Key is at most
// 1 KB of Redis (MEMORY USAGE), and its replays are the first answer byte
// for byte: the same ids and states; so is a single notification's, with
// its Location.
func TestIdempotencyRecordSize(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.tokens["acme"]
	var items []any
	for i := range api.MaxBatch {
		items = append(items, sms(fmt.Sprintf("+1415555%04d", i), "your code"))
	}
	body := map[string]any{"notifications": items}
	first := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "big-batch")
	if first.status != 202 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	size, err := b.rdb.MemoryUsage(context.Background(), api.IdempotencyRedisKey("acme", "big-batch")).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("record of a %d-notification batch: %d B (MEMORY USAGE); the answer is %d B", api.MaxBatch, size, len(first.body))
	if size > 1024 {
		t.Fatalf("record of a 500-notification batch is %d B, over 1 KB", size)
	}
	for range 2 {
		again := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "big-batch")
		if again.status != 202 || again.header.Get(api.HeaderReplayed) != "true" || string(again.body) != string(first.body) {
			t.Fatalf("replay differs: %d %v\n%.300s\nwant\n%.300s", again.status, again.header, again.body, first.body)
		}
	}
	one := b.do(t, "POST", "/v1/notifications", tok, sms("+14155550999", "single"), "Idempotency-Key", "single")
	re := b.do(t, "POST", "/v1/notifications", tok, sms("+14155550999", "single"), "Idempotency-Key", "single")
	if one.status != 202 || re.status != 202 || string(re.body) != string(one.body) || re.header.Get("Location") != one.header.Get("Location") ||
		re.header.Get("Location") != "/v1/notifications/"+api.NotificationID("acme", "single", 0) {
		t.Fatalf("single replay: %d %s %q, first %d %s %q", re.status, re.body, re.header.Get("Location"), one.status, one.body, one.header.Get("Location"))
	}
}
