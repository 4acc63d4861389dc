package api_test

import (
	"fmt"
	"net/http"

	"github.com/sluicehq/sluice/api"
)

// A retry carries the same Idempotency-Key, so it maps to the same
// notification ids: the second enqueue can never be a second notification.
func ExampleNotificationID() {
	h := http.Header{}
	h.Set("Idempotency-Key", `"order-42-shipped"`)
	key, _, _ := api.ParseIdempotencyKey(h)
	fmt.Println(key)
	fmt.Println(api.NotificationID("acme", key, 0) == api.NotificationID("acme", key, 0))
	fmt.Println(api.NotificationID("acme", key, 0) == api.NotificationID("globex", key, 0))
	fmt.Println(len(api.NotificationID("acme", key, 1)))
	// Output:
	// order-42-shipped
	// true
	// false
	// 35
}
