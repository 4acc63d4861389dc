package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
)

// fallbacks arms and enqueues a notification's fallback on another
// channel when its own send fails or is not delivered.
type fallbacks struct {
	*core
	inspector *asynq.Inspector // runs an armed fallback at once
}

// Channel fallback (tasks.Fallback). An SMS with a fallback arms it just
// before it goes to its provider: the fallback is enqueued, scheduled for
// the SMS's After (or tasks.MaxFallbackAfter when it goes only on failure),
// and its queue noted (delivery.Store.NoteFallback). What says the SMS
// will not arrive runs it at once: a permanent refusal or a blocked
// recipient here (fallBack), a failed or undelivered status callback in
// the API. The fallback is a notification of its own, under its channel's
// rules and consent; when it runs it first reads the SMS's delivery record
// (fallbackNeeded) and is sent only when the SMS failed, or, with an After,
// when no report called it delivered by then. One task id makes it go at
// most once, whoever triggers it.

// fallBack sends n's fallback now: n will not arrive (its provider refused
// it for good, or its recipient is blocked). It records n as failed (code:
// the provider's, 0 if none), so the fallback reads it so, and runs the
// armed fallback, or enqueues it when none was armed.
func (fbk *fallbacks) fallBack(ctx context.Context, n tasks.Notification, code int, log *slog.Logger) {
	if n.Fallback == nil {
		return
	}
	ctx, cancel := fbk.afterSendContext(ctx)
	defer cancel()
	if _, _, err := fbk.delivery.Update(ctx, n.Tenant, n.ID, delivery.Record{Status: delivery.Failed, ErrorCode: code}, fbk.cfg.DedupeTTL); err != nil {
		log.Warn("could not record the failure for the fallback; sending it anyway", "err", err)
	}
	err := fbk.delivery.RunFallback(ctx, fbk.inspector, n.Tenant, n.ID)
	if errors.Is(err, delivery.ErrNoFallback) {
		_, err = fbk.enqueueFallback(ctx, n)
	}
	if err != nil {
		log.Error("could not start the fallback of a notification that will not arrive", "err", err)
		return
	}
	fbk.metrics.Fallbacks.WithLabelValues(string(n.Channel), "triggered").Inc()
	log.Info("the notification will not arrive: its fallback goes now", "fallback", tasks.FallbackID(n.ID), "channel", string(n.Fallback.Channel))
}

// enqueueFallback enqueues n's fallback with opts; one already enqueued
// (the same id) is left as it is. It returns the queue.
func (fbk *fallbacks) enqueueFallback(ctx context.Context, n tasks.Notification, opts ...asynq.Option) (string, error) {
	fb := tasks.FallbackOf(n)
	queue := fbk.currentPolicy().Queue(fbk.layout, fb)
	t, err := tasks.NewTaskContext(ctx, fb, fbk.keys, append([]asynq.Option{asynq.Queue(queue)}, opts...)...)
	if err != nil {
		return "", err
	}
	if _, err := fbk.client.EnqueueContext(ctx, t); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return "", err
	}
	return queue, nil
}

// armFallback enqueues n's fallback, scheduled, before n goes to its
// provider (SMS and WhatsApp: delivery reports may run it earlier). A fallback already
// armed by an earlier attempt stays as it is. One that cannot be armed is
// logged; n is sent anyway, and a permanent refusal still enqueues it.
func (fbk *fallbacks) armFallback(ctx context.Context, n tasks.Notification, log *slog.Logger) {
	if n.Fallback == nil || (n.Channel != tasks.SMS && n.Channel != tasks.WhatsApp) {
		return
	}
	after := time.Duration(n.Fallback.After)
	if after == 0 {
		after = tasks.MaxFallbackAfter
	}
	at := slotTime(time.Now().Add(after)) // Asynq keeps whole seconds: rounded up, never early
	queue, err := fbk.enqueueFallback(ctx, n, asynq.ProcessAt(at))
	if err == nil {
		err = fbk.delivery.NoteFallback(ctx, n.Tenant, n.ID, queue, after+time.Minute)
	}
	if err != nil {
		log.Warn("could not arm the fallback; a permanent refusal still sends it, a status callback cannot", "err", err)
		return
	}
	fbk.metrics.Fallbacks.WithLabelValues(string(n.Channel), "armed").Inc()
}

// fallbackNeeded reads what became of the notification a fallback stands
// in for: false when there is nothing to send (it was delivered, or it
// did not fail and the fallback goes only on failure).
func (fbk *fallbacks) fallbackNeeded(ctx context.Context, n tasks.Notification, log *slog.Logger) (bool, error) {
	rec, err := fbk.delivery.Get(ctx, n.Tenant, n.FallbackFor)
	if err != nil {
		log.Error("could not read the delivery record of the notification this fallback stands in for; will try again", "err", err)
		return false, &UnavailableError{Err: err}
	}
	outcome := ""
	if rec != nil {
		outcome = rec.Status.Outcome()
	}
	switch {
	case outcome == "delivered":
		log.Info("fallback not sent: the notification it stands in for was delivered", "for", n.FallbackFor)
	case outcome != "":
		log.Info("sending a fallback: the notification it stands in for did not arrive", "for", n.FallbackFor, "status", string(rec.Status))
		return true, nil
	case n.FallbackOnTimeout:
		log.Info("sending a fallback: no report called the notification it stands in for delivered in time", "for", n.FallbackFor)
		return true, nil
	default:
		log.Info("fallback not sent: the notification it stands in for did not fail", "for", n.FallbackFor)
	}
	fbk.metrics.Fallbacks.WithLabelValues(string(n.Channel), "not_needed").Inc()
	return false, nil
}
