package keyspace_test

import (
	"fmt"

	"github.com/sluicehq/sluice/keyspace"
)

// The keys of one notification's check: a recipient's window (the subject
// as the limiter's HMAC gives it), the notification's state record, and
// the Asynq task it runs as; and the key table's row for a key found in
// Redis.
func Example() {
	var s keyspace.Space // the default prefix, sl1
	fmt.Println(s.Window("acme", "sms:recipient", "60000", "N_2VYSAF0HLmZj2JEizYNw"))
	fmt.Println(s.State("acme", "01j9"))
	fmt.Println(keyspace.AsynqQueue("notifications.standard.3").Task("01j9"))
	row, ok := keyspace.Match("sluice:{held}:holders")
	fmt.Println(ok, row.Owner)
	// Output:
	// sl1:{acme}:sms:recipient:60000:N_2VYSAF0HLmZj2JEizYNw
	// sl1:{acme}:n:01j9
	// asynq:{notifications.standard.3}:t:01j9
	// true `internal/orphans` (`HoldersKey`)
}
