package worker

import (
	"context"
	"errors"

	"github.com/hibiken/asynq"
	"github.com/sluicehq/sluice/tasks"
)

// The send path. Every task runs through these stages, in this order,
// composed in throttleMiddleware below; each is a type of its own (its
// file) that either hands the task on or ends the run with what Asynq is to
// do with it:
//
//	intake      (intake.go)    the Asynq servers and their client: the fair
//	                           dispatch takes up to the idle send slots' worth of
//	                           tasks in one round trip; Asynq's completions are
//	                           written in batches
//	admission   (admission.go) decode (what can never be sent is archived),
//	                           route (a task in another lane or shard is moved
//	                           there), the service window (a free-form WhatsApp
//	                           message outside it is archived), comply (what the
//	                           rules demand of the notification itself), then the
//	                           check: the limiter under the plans in force, the
//	                           checks of tasks taken together in one call
//	digester    (digest.go)    deferred sends folded into one message per slot
//	providerSet (failover.go)  the provider a send goes to: up, held, probed
//	waiter      (wait.go)      an admission for a near slot waits in process
//	dispatcher  (dispatch.go)  the request to the provider and its answer:
//	                           caps, late checks, failover, holds, retries
//	records     (records.go)   the outcome written: the done record, a slot
//	                           given back, a reschedule for a slot ahead
//	fallbacks   (fallback.go)  a failed or undelivered send's other channel
//
// What they all read — settings, the shared services, metrics — is core
// (core.go).

// sendPath is the send path's stages, composed in throttleMiddleware.
type sendPath struct {
	*core
	adm  *admission
	wait *waiter
	disp *dispatcher
	prov *providerSet
	rec  *records
	dig  *digester
	fb   *fallbacks
}

// throttleMiddleware runs the send path's stages (above) for each task and
// lets the handler send only what every rule admits.
func (sp *sendPath) throttleMiddleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		n, err := sp.adm.decode(ctx, t)
		if err != nil {
			return err
		}
		traceNotification(ctx, n)
		placeOf(ctx).known(sp.recipientKey(ctx, n))
		log := sp.log.With("id", n.ID, "tenant", n.Tenant, "channel", n.Channel, "category", n.CategoryOrDefault())
		if moved, err := sp.adm.route(ctx, t, n, log); moved {
			return err
		}
		if n.FallbackFor != "" {
			if need, err := sp.fb.fallbackNeeded(ctx, n, log); !need {
				sp.rec.leftQueue(ctx, t, n, err, log)
				return err
			}
		}
		if err := sp.adm.serviceWindow(ctx, n, log); err != nil {
			sp.rec.leftQueue(ctx, t, n, err, log)
			return err
		}
		var tried []string // providers that did not take it in this run
		for {
			onTheWay(ctx, true) // again, after a failover
			a, err := sp.adm.reserve(ctx, t, &n, tried, log)
			if a == nil {
				sp.rec.leftQueue(ctx, t, n, err, log)
				return err
			}
			sendCtx, span := sp.startSend(ctx, n, a.d)
			err = sp.disp.dispatch(sendCtx, t, n, a, tried, next, log)
			endSend(span, err)
			var fo *errFailover
			if errors.As(err, &fo) {
				// A priority send its provider did not take: the next one, now.
				tried = append(tried, fo.from)
				sp.metrics.Failovers.WithLabelValues(string(n.Channel), fo.from).Inc()
				log.Warn("provider did not take a priority send; trying the next one", "provider", fo.from, "err", fo.err)
				continue
			}
			var pw *errProviderWait
			if errors.As(err, &pw) {
				// A standard send its provider did not take, or held: it
				// picks again once the provider's grace is over, or its
				// state changes — in process when that is near.
				if sp.wait.waitForProvider(ctx, pw, log) {
					continue
				}
				err = sp.prov.providerWait(n, err, log)
			}
			sp.rec.leftQueue(ctx, t, n, err, log)
			return err
		}
	})
}

// close writes the removals of what was sent from the queued-work counts,
// then closes the senders' pools.
func (sp *sendPath) close() {
	sp.rec.released.wait()
	sp.prov.close()
}

// recipientKey names whom n goes to, for the order of one recipient's
// checks: its tenant, its lane and its recipient.
func (sp *sendPath) recipientKey(ctx context.Context, n tasks.Notification) string {
	q, _ := asynq.GetQueueName(ctx)
	lane, _, _ := sp.layout.Parse(q)
	return n.Tenant + "\x00" + string(lane) + "\x00" + string(n.Channel) + "\x00" + n.To
}
