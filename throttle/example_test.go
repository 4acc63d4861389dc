package throttle_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// exampleRedis is set by the example's harness (example_main_test.go) to a
// private redis-server.
var exampleRedis func() redis.UniversalClient

// The classic sliding-log demo: 5 per 10 seconds, 8 requests — 5 allowed, 3 denied.
func Example() {
	ctx := context.Background()
	lim, err := throttle.New(exampleRedis(), throttle.Options{Secret: []byte("change-me-to-32-random-bytes....")})
	if err != nil {
		log.Fatal(err)
	}
	quota := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 5, Window: 10 * time.Second}}
	for i := 1; i <= 8; i++ {
		d, err := lim.Allow(ctx, "acme", fmt.Sprintf("notification-%d", i), quota)
		if err != nil {
			log.Fatal(err)
		}
		if d.Allowed {
			fmt.Printf("Request %d: ALLOW (%d left)\n", i, d.Remaining)
		} else {
			fmt.Printf("Request %d: DENY (retry in about %ds)\n", i, (d.RetryAfter+time.Second/2)/time.Second)
		}
	}
	// Output:
	// Request 1: ALLOW (4 left)
	// Request 2: ALLOW (3 left)
	// Request 3: ALLOW (2 left)
	// Request 4: ALLOW (1 left)
	// Request 5: ALLOW (0 left)
	// Request 6: DENY (retry in about 10s)
	// Request 7: DENY (retry in about 10s)
	// Request 8: DENY (retry in about 10s)
}

func ExampleParseRule() {
	for _, s := range []string{"1/1m", "5/24h", "1000/1h", "0/1m", "10/fortnight"} {
		r, err := throttle.ParseRule(s)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Printf("%s → %d per %v\n", r, r.Limit, r.Window)
	}
	// Output:
	// 1/1m → 1 per 1m0s
	// 5/1d → 5 per 24h0m0s
	// 1000/1h → 1000 per 1h0m0s
	// error: "0/1m": throttle: invalid rule: limit 0 must be between 1 and 1000000
	// error: throttle: invalid rule: "10/fortnight": window "fortnight": time: invalid duration "fortnight"
}
