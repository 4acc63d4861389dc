package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
)

// Fallbacks. A worker that sends an SMS with a fallback (tasks.Fallback)
// enqueues the fallback beforehand, scheduled for the SMS's After, and
// notes here the queue it went to. Whoever learns that the SMS will not
// arrive — the worker from a permanent refusal, the API from a failed or
// undelivered status callback — runs the fallback at once (RunFallback);
// when it runs it reads the SMS's delivery record and sends only if no
// report called it delivered. One task id (tasks.FallbackID) makes it go at
// most once, whoever triggers it.

// FallbackKind names the fallback notes among a notification's records.
const FallbackKind = keyspace.RecordFallback

// FallbackKey is the key of the note of id's pending fallback in tenant.
func (s *Store) FallbackKey(tenant, id string) string {
	return s.lim.RecordKey(tenant, id, FallbackKind)
}

// NoteFallback notes that id's fallback waits in queue, for ttl.
func (s *Store) NoteFallback(ctx context.Context, tenant, id, queue string, ttl time.Duration) error {
	if err := s.rdb.Set(ctx, s.FallbackKey(tenant, id), queue, max(ttl, time.Second)).Err(); err != nil {
		return fmt.Errorf("delivery: note fallback: %w", err)
	}
	return nil
}

// ErrNoFallback: no fallback of the notification waits (none was asked
// for, it went already, or its note lapsed).
var ErrNoFallback = errors.New("delivery: no pending fallback")

// RunFallback runs the pending fallback of id at once: ErrNoFallback when
// none waits.
func (s *Store) RunFallback(ctx context.Context, insp *asynq.Inspector, tenant, id string) error {
	queue, err := s.rdb.Get(ctx, s.FallbackKey(tenant, id)).Result()
	if errors.Is(err, redis.Nil) {
		return ErrNoFallback
	}
	if err != nil {
		return fmt.Errorf("delivery: read fallback note: %w", err)
	}
	err = insp.RunTask(queue, tasks.FallbackID(id))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return ErrNoFallback
	default:
		// Already pending or running: it goes.
		return nil
	}
}

// ProviderKind names the note of which provider took a notification.
const ProviderKind = keyspace.RecordProvider

// NoteProvider records that provider (a name of SLUICE_*_PROVIDERS) took
// the notification id of tenant, for ttl: the status shows it.
func (s *Store) NoteProvider(ctx context.Context, tenant, id, provider string, ttl time.Duration) error {
	if err := s.rdb.Set(ctx, s.lim.RecordKey(tenant, id, ProviderKind), provider, max(ttl, time.Second)).Err(); err != nil {
		return fmt.Errorf("delivery: note provider: %w", err)
	}
	return nil
}

// Provider returns the provider NoteProvider recorded for id ("" none).
func (s *Store) Provider(ctx context.Context, tenant, id string) (string, error) {
	v, err := s.rdb.Get(ctx, s.lim.RecordKey(tenant, id, ProviderKind)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("delivery: read provider: %w", err)
	}
	return v, nil
}
