package smtp

import (
	"errors"
	"net/textproto"
	"testing"

	"github.com/sluicehq/sluice/sender"
)

// SMTP 421, 451, 452 and 454 are throttling answers that hold the relay;
// other 4xx replies are plain transient failures, 5xx permanent.
func TestThrottlingReplies(t *testing.T) {
	for code, want := range map[int]bool{421: true, 451: true, 452: true, 454: true, 450: false, 441: false, 550: false} {
		var se *sender.SendError
		if !errors.As(classifyReply(&textproto.Error{Code: code, Msg: "x"}, false), &se) {
			t.Fatalf("%d: no SendError", code)
		}
		if se.Throttled != want || (want && se.Hold != sender.HoldProvider) || !se.NotSent {
			t.Errorf("%d: %+v", code, se)
		}
	}
}
