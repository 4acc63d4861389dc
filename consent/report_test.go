package consent_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
)

// Each word of a report means one event, whichever door it came through
// (POST /v1/events, a provider's webhook); a bad one names its field.
func TestReportEvent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC)
	later := now.Add(time.Hour)
	// An undeliverable mark's scope is left for Record to fill (every category).
	for _, c := range []struct {
		r      consent.Report
		action consent.Action
		source consent.Source
		scope  string
		until  time.Time
		field  string
	}{
		{r: consent.Report{Type: "bounce", Code: 550, Ref: "ses.abc"}, action: consent.Undeliverable, source: consent.SourceBounce, until: now.Add(720 * time.Hour)},
		{r: consent.Report{Type: "bounce", Until: &later}, action: consent.Undeliverable, source: consent.SourceBounce, until: later},
		{r: consent.Report{Type: "undeliverable"}, action: consent.Undeliverable, source: consent.SourceAPI},
		{r: consent.Report{Type: "complaint"}, action: consent.OptOut, source: consent.SourceComplaint, scope: "*"},
		{r: consent.Report{Type: "unsubscribe", Category: "news"}, action: consent.OptOut, source: consent.SourceAPI, scope: "news"},
		{r: consent.Report{Type: "out", Scope: "b, a"}, action: consent.OptOut, source: consent.SourceAPI, scope: "a,b"},
		{r: consent.Report{Type: "resubscribe"}, action: consent.OptIn, source: consent.SourceAPI, scope: "*"},
		{r: consent.Report{Type: "maybe"}, field: "type"},
		{r: consent.Report{Type: "out", Scope: "a", Category: "b"}, field: "category"},
		{r: consent.Report{Type: "out", Scope: "Not A Category"}, field: "scope"},
		{r: consent.Report{Type: "out", Category: "Bad Cat"}, field: "category"},
		{r: consent.Report{Type: "bounce", Scope: "news"}, field: "scope"},
		{r: consent.Report{Type: "out", Until: &now}, field: "until"},
		{r: consent.Report{Type: "in", Until: &later}, field: "until"},
		{r: consent.Report{Type: "out", Code: 1 << 30}, field: "code"},
		{r: consent.Report{Type: "out", Ref: "has space"}, field: "ref"},
	} {
		e, field, err := c.r.Event(720*time.Hour, now)
		if c.field != "" {
			if err == nil || field != c.field || !errors.Is(err, consent.ErrInvalid) {
				t.Errorf("%+v: field %q, err %v; want field %q and ErrInvalid", c.r, field, err, c.field)
			}
			continue
		}
		if err != nil || e.Action != c.action || e.Source != c.source || e.Scope.String() != c.scope || !e.Until.Equal(c.until) || e.Code != c.r.Code || e.Ref != c.r.Ref {
			t.Errorf("%+v: %+v, %v", c.r, e, err)
		}
	}
}
