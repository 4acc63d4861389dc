package api_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// A signed status callback marks a number undeliverable only when it is
// the notification's recipient: one auth token signs every tenant's
// callbacks, so a callback naming another number changes no one's
// consent — the next SMS to that number is sent.
func TestCallbackMarksOnlyTheRecipient(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m", nil)
	b.RunWorker(t, app.WorkerOptions{})
	id := b.enqueue(t, apienv.NewSMS("+14155550144", "hello"))
	b.delivery(t, id)
	path := "/v1/callbacks/sms/acme/" + id
	params := url.Values{"MessageSid": {"SM1"}, "MessageStatus": {"undelivered"}, "ErrorCode": {"30005"}, "To": {"+14155550999"}, "AccountSid": {b.SMS.AccountSID}}
	code, err := b.SMS.PostCallback(context.Background(), b.HTTP.URL+path, params, fakes.Sign(b.SMS.AuthToken, b.CallbackURL+path, params))
	if err != nil || code != http.StatusNoContent {
		t.Fatalf("signed callback: %d %v", code, err)
	}
	other := b.enqueue(t, apienv.NewSMS("+14155550999", "to the number the callback named"))
	b.delivery(t, other)
	again := b.enqueue(t, apienv.NewSMS("+14155550144", "to the recipient"))
	b.delivery(t, again)
}
