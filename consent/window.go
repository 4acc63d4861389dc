package consent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
)

// ServiceWindow is WhatsApp's customer-service window: for this long after
// a user's last message to the business, the business may send it free-form
// messages; outside it only approved templates.
const ServiceWindow = 24 * time.Hour

// ErrWindowClosed reports a free-form message to a recipient whose
// customer-service window is closed (no message from it in ServiceWindow).
var ErrWindowClosed = errors.New("consent: the recipient's customer-service window is closed (no message from it in 24 h): only a template may start the conversation")

// Window is a recipient's customer-service window.
type Window struct {
	// LastInbound is when the recipient last wrote to the tenant (zero:
	// not within ServiceWindow, as far as Sluice heard).
	LastInbound time.Time
	// Closes is when the window closes (LastInbound + ServiceWindow).
	Closes time.Time
}

// Open reports whether the window is open at t.
func (w Window) Open(t time.Time) bool { return !w.LastInbound.IsZero() && t.Before(w.Closes) }

// InboundKey is the key of (tenant, ch, to)'s last inbound message:
// <prefix>:{<tenant>}:inbound:<channel>:<HMAC>, the message's ms, living
// ServiceWindow from it. "" for a recipient that cannot be keyed.
func (s *Store) InboundKey(tenant string, ch tasks.Channel, to string) string {
	norm, err := recipient(tenant, ch, to)
	if err != nil {
		return ""
	}
	return s.space().Inbound(tenant, string(ch), s.lim.Subject(norm))
}

// RecordInbound notes that to wrote to tenant on ch at at (a provider's
// inbound webhook): the customer-service window runs ServiceWindow from
// the latest such message. An older message than the one recorded changes
// nothing.
func (s *Store) RecordInbound(ctx context.Context, tenant string, ch tasks.Channel, to string, at time.Time) error {
	key := s.InboundKey(tenant, ch, to)
	if key == "" {
		return fmt.Errorf("%w: recipient", ErrInvalid)
	}
	now := s.clock()
	ttl := at.Add(ServiceWindow).Sub(now)
	if ttl <= 0 {
		return nil // the window it opened has closed already
	}
	if err := recordInbound.Run(ctx, s.rdb, []string{key}, at.UnixMilli(), ttl.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("consent: record inbound: %w", err)
	}
	return nil
}

// recordInbound keeps the latest of two inbound times with its TTL.
// KEYS[1] -> the inbound key; ARGV[1] -> at_ms; ARGV[2] -> ttl_ms. Returns 1 if kept.
var recordInbound = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`)

// Window reads (tenant, ch, to)'s customer-service window.
func (s *Store) Window(ctx context.Context, tenant string, ch tasks.Channel, to string) (Window, error) {
	key := s.InboundKey(tenant, ch, to)
	if key == "" {
		return Window{}, fmt.Errorf("%w: recipient", ErrInvalid)
	}
	v, err := s.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return Window{}, nil
	}
	if err != nil {
		return Window{}, fmt.Errorf("consent: service window: %w", err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return Window{}, fmt.Errorf("consent: service window holds %q", v)
	}
	at := time.UnixMilli(ms)
	return Window{LastInbound: at, Closes: at.Add(ServiceWindow)}, nil
}

// CheckWindow reports ErrWindowClosed for a free-form WhatsApp message (no
// template) to a recipient whose window is closed at now; nil for anything
// else (a template, another channel).
func (s *Store) CheckWindow(ctx context.Context, n tasks.Notification, now time.Time) error {
	if n.Channel != tasks.WhatsApp || n.Template != nil {
		return nil
	}
	w, err := s.Window(ctx, n.Tenant, n.Channel, n.To)
	if err != nil {
		return err
	}
	if !w.Open(now) {
		return ErrWindowClosed
	}
	return nil
}

func (s *Store) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}
