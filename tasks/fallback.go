package tasks

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Fallback is what to send instead when a notification cannot reach its
// recipient on its own channel: an SMS that the provider refused for good
// (an invalid number), that its status report says was not delivered
// (failed, undelivered), whose number is suppressed, or that no report
// called delivered within After. The fallback is a notification of its
// own (FallbackOf): its channel's rules, consent and quiet hours apply to
// it as to any send.
type Fallback struct {
	// Channel is the other channel (email for an SMS, sms for an email).
	Channel Channel `json:"channel"`
	// To is the recipient on that channel.
	To string `json:"to"`
	// Subject is the email's subject (required for email).
	Subject string `json:"subject,omitempty"`
	// Body replaces the notification's body; empty: the same body.
	Body string `json:"body,omitempty"`
	// After: sent when no report called the SMS delivered this long after
	// it went to the provider (at most MaxFallbackAfter; SMS only: email
	// has no delivery reports here). Zero: only when it fails.
	After Duration `json:"after,omitzero"`
}

// Duration is a time.Duration written in JSON as Go writes it ("2m", "90s").
type Duration time.Duration

// MarshalJSON writes d as "2m0s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "2m", "90s", ...
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return invalid("fallback.after", "must be a duration such as \"2m\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return invalid("fallback.after", fmt.Sprintf("%q is not a duration such as \"2m\"", s))
	}
	*d = Duration(v)
	return nil
}

// MaxFallbackAfter bounds Fallback.After.
const MaxFallbackAfter = 24 * time.Hour

// fallbackSuffix ends a fallback's id: the notification's id with it.
const fallbackSuffix = ".fb"

// FallbackID is the id of the fallback of the notification with id id.
func FallbackID(id string) string { return id + fallbackSuffix }

// FallbackOf returns the notification sent instead of n (n.Fallback must
// be set): the same tenant, category, person, expiry and metadata, on the
// fallback's channel, with the id FallbackID(n.ID) (so it is enqueued at
// most once, whoever triggers it) and no fallback of its own.
func FallbackOf(n Notification) Notification {
	f := n.Fallback
	body := f.Body
	if body == "" {
		body = n.Body
	}
	return Notification{ID: FallbackID(n.ID), Tenant: n.Tenant, Channel: f.Channel, To: f.To, Subject: f.Subject, Body: body,
		Category: n.Category, User: n.User, ExpiresAt: n.ExpiresAt, TZ: n.TZ, Metadata: n.Metadata, TemplateID: n.TemplateID,
		FallbackFor: n.ID, FallbackOnTimeout: f.After > 0}
}

// validateFallback checks n's fallback: another channel, a recipient and
// (for email) a subject valid there, an id with room for the suffix, and
// After within bounds. The fallback notification is validated whole.
func (n Notification) validateFallback() error {
	if n.FallbackOnTimeout && n.FallbackFor == "" {
		return invalid("fallback_on_timeout", "is set by Sluice on the fallback it sends")
	}
	if n.FallbackFor != "" && n.ID != FallbackID(n.FallbackFor) {
		return invalid("fallback_for", "is set by Sluice on the fallback it sends (its id is the notification's with \""+fallbackSuffix+"\")")
	}
	f := n.Fallback
	if f == nil {
		return nil
	}
	if n.FallbackFor != "" {
		return invalid("fallback", "a fallback has no fallback of its own")
	}
	if strings.TrimSpace(f.To) == "" {
		return invalid("fallback.to", "is empty")
	}
	if f.Channel == n.Channel {
		return invalid("fallback.channel", fmt.Sprintf("is %q, the notification's own channel: a fallback goes on the other one", f.Channel))
	}
	if len(n.ID)+len(fallbackSuffix) > MaxIDLen {
		return invalid("fallback", fmt.Sprintf("needs an id of at most %d characters (the fallback's id is the notification's with %q)", MaxIDLen-len(fallbackSuffix), fallbackSuffix))
	}
	if f.After < 0 || time.Duration(f.After) > MaxFallbackAfter {
		return invalid("fallback.after", fmt.Sprintf("must be between 0 and %v", MaxFallbackAfter))
	}
	if f.After != 0 && n.Channel != SMS && n.Channel != WhatsApp {
		return invalid("fallback.after", "applies to SMS and WhatsApp only (delivery reports say whether it arrived); an email's fallback goes when it fails")
	}
	fb := FallbackOf(n)
	fb.Fallback = nil
	if err := fb.Normalized().Validate(); err != nil {
		return fmt.Errorf("fallback: %w", err)
	}
	return nil
}
