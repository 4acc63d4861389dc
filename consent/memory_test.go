package consent_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// What suppressions and ledger events cost in Redis memory: INFO
// used_memory before and after many events (allocator overhead included),
// and MEMORY USAGE of single keys. The figures are logged (go test -v -run
// TestMemoryCost ./consent) for the documentation; the bounds only catch a
// format that bloats.
func TestMemoryCost(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, nil, consent.Options{})
	ctx := context.Background()
	used := func() int64 {
		t.Helper()
		info := b.rdb.Info(ctx, "memory").Val()
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory in INFO")
		return 0
	}
	recipients := 4000
	if n, err := strconv.Atoi(os.Getenv("CONSENT_MEMORY_RECIPIENTS")); err == nil && n > 0 {
		recipients = n // a larger sample for the documentation's figures
	}
	number := func(i int) string { return fmt.Sprintf("+1415%07d", i) }
	// Events as the webhook would record them: a STOP with the inbound
	// message's SID.
	stop := consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(),
		Ref: "SM0123456789abcdef0123456789abcdef", Keyword: "STOP"}
	review := consent.Event{Action: consent.Review, Source: consent.SourceKeyword, Ref: "SM0123456789abcdef0123456789abcdef", Keyword: "DONT TEXT"}
	// each runs f for 0..n-1 on 4 goroutines.
	each := func(n int, f func(i int) error) {
		t.Helper()
		inParallel(t, 4, (n+3)/4, func(w, i int) error {
			if j := 4*i + w; j < n {
				return f(j)
			}
			return nil
		})
	}

	base := used()
	each(recipients, func(i int) error {
		_, err := b.store.Record(ctx, b.tenant, tasks.SMS, number(i), stop)
		return err
	})
	first := used()
	const more = 9
	each(recipients, func(i int) error {
		for range more {
			if _, err := b.store.Record(ctx, b.tenant, tasks.SMS, number(i), review); err != nil {
				return err
			}
		}
		return nil
	})
	after := used()
	perFirst := float64(first-base) / float64(recipients)
	perMore := float64(after-first) / float64(recipients*more)

	usage := func(key string) int64 {
		t.Helper()
		n, err := b.rdb.MemoryUsage(ctx, key, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	hash := b.store.Key(b.tenant, tasks.SMS, number(0))
	ledgerKey := strings.Replace(hash, ":consent:", ":ledger:", 1)
	hashOne := usage(hash)
	ledger10 := usage(ledgerKey)
	b.record(t, tasks.SMS, "+13055550100", stop)
	ledgerOne := usage(strings.Replace(b.store.Key(b.tenant, tasks.SMS, "+13055550100"), ":consent:", ":ledger:", 1))
	// A hash with an undeliverable mark and two categories besides.
	b.record(t, tasks.SMS, number(0), consent.Event{Action: consent.Undeliverable, Source: consent.SourceProvider, Code: 21610})
	b.record(t, tasks.SMS, number(0), consent.Event{Action: consent.OptIn, Source: consent.SourceAPI, Scope: consent.Categories("news", "otp")})
	hashFour := usage(hash)
	// A ledger of 1,000 events (the default bound).
	for range consent.DefaultMaxEvents - 12 {
		b.record(t, tasks.SMS, number(0), review)
	}
	ledger1000 := usage(ledgerKey)
	entry := len(b.rdb.LIndex(ctx, ledgerKey, 0).Val())

	t.Logf("used_memory per recipient's first event (a new hash with \"*\" and a new ledger): %.0f bytes", perFirst)
	t.Logf("used_memory per further event on an existing ledger: %.0f bytes (entry %d bytes)", perMore, entry)
	t.Logf("MEMORY USAGE: hash with \"*\" %d bytes, with 4 fields %d; ledger of 1 event %d, of 10 events %d (%.0f/event), of %d events %d (%.0f/event)",
		hashOne, hashFour, ledgerOne, ledger10, float64(ledger10)/10, consent.DefaultMaxEvents, ledger1000, float64(ledger1000)/float64(consent.DefaultMaxEvents))
	if perFirst > 700 || perMore > 160 || hashOne > 300 || float64(ledger1000)/float64(consent.DefaultMaxEvents) > 120 {
		t.Fatalf("memory grew past the documented bounds: first %.0f, further %.0f, hash %d, ledger %d",
			perFirst, perMore, hashOne, ledger1000)
	}
}
