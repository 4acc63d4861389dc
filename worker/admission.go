package worker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/unsubscribe"
)

// admission is the check: it opens a task, routes it, applies what the
// rules demand of the notification itself, and asks the limiter — under the
// plans in force, through the provider picked — until the send is admitted
// for now (waiting in process for a near slot), or the run ends booked,
// settled or archived.
type admission struct {
	*core
	planner     plans.Planner
	onDecide    func(tasks.Notification, throttle.Decision) // Options.OnDecision
	unsubscribe *unsubscribe.Signer                         // nil without SLUICE_UNSUBSCRIBE_URL
	fromDomains config.FromDomains                          // SLUICE_EMAIL_FROM_DOMAINS
	prov        *providerSet
	dig         *digester
	wait        *waiter
	rec         *records
	fb          *fallbacks
}

// hostedUnsubscribe gives an email of a category whose rules ask for
// hosted links (unsubscribe=hosted) Sluice's one-click link, unless it
// carries an https URL of its own (that one stays; a mailto: of its own is
// kept beside the hosted link). It returns false when it cannot: no
// SLUICE_UNSUBSCRIBE_URL.
func (ad *admission) hostedUnsubscribe(n *tasks.Notification) (bool, error) {
	own, _ := tasks.ParseListUnsubscribe(n.ListUnsubscribe)
	if n.ListUnsubscribe != "" && own.HTTPS != "" {
		return true, nil
	}
	if ad.unsubscribe == nil {
		return false, nil
	}
	subject, err := ad.consent.Subject(n.Tenant, tasks.Email, n.To)
	if err != nil {
		return false, err
	}
	link, err := ad.unsubscribe.URL(ad.cfg.UnsubscribeURL, unsubscribe.Link{Tenant: n.Tenant, Category: n.CategoryOrDefault(), Subject: subject})
	if err != nil {
		return false, err
	}
	uris := []string{link}
	if own.Mailto != "" {
		uris = append(uris, strings.TrimSpace(own.Mailto))
	}
	n.ListUnsubscribe = strings.Join(uris, ", ")
	return true, nil
}

// consentCheck is what the limiter reads of n's recipient's consent in the
// same script call as the quota check: their suppression hash, whether the
// category is one an opt-out of every category lets through, and, under
// optout=category for SMS, where to remember the category for a keyword
// opt-out. nil for a recipient that cannot be keyed.
func (ad *admission) consentCheck(p plans.Policy, n tasks.Notification) *throttle.ConsentCheck {
	key := ad.consent.Key(n.Tenant, n.Channel, n.To)
	if key == "" {
		return nil
	}
	cat := n.CategoryOrDefault()
	cc := &throttle.ConsentCheck{Key: key, Category: cat, Exempt: p.ConsentExempt(n.Tenant, n.Channel, cat)}
	if n.Channel == tasks.SMS && p.Consent(n.Tenant, n.Channel).OptOut == plans.OptOutCategory && cat != plans.ReplyCategory {
		cc.LastKey, cc.LastTTL = ad.consent.LastKey(n.Tenant, n.Channel, n.To), consent.LastCategoryTTL
	}
	return cc
}

// dedupeTTL: how long a notification's record lives — at least the longest
// window it counts in, so an unfinished attempt is known while it counts.
func (ad *admission) dedupeTTL(limits []throttle.Limit) time.Duration {
	ttl := ad.cfg.DedupeTTL
	for _, l := range limits {
		ttl = max(ttl, l.Rule.Window+ad.cfg.SendSlack)
	}
	return ttl
}

// plan works out the rules, quiet hours and deadline of a notification
// under the policy p (one consistent version for the whole check), with
// the planner every reader shares, and the limiter options they give.
func (ad *admission) plan(p plans.Policy, n tasks.Notification) check {
	c := check{Check: ad.planner.Check(p, n, ad.cfg.Origin(n), time.Now()), opts: ad.reserveOptions()}
	switch c.Match.Rerun {
	case plans.AtMostOnce:
		c.opts.Policy = throttle.AtMostOnce
	case plans.AtLeastOnce:
		c.opts.Policy = throttle.AtLeastOnce
	}
	c.opts.StateTTL = ad.dedupeTTL(c.Limits)
	c.opts.Deadline = c.SendBy(ad.cfg.SendSlack) // the send must reach the provider by the deadline
	c.opts.Closed = c.Closed
	c.opts.Consent = ad.consentCheck(p, n)
	// The provider's and its sender's holds are bound when the provider is
	// picked (bindProvider).
	return c
}

// settled handles the limiter's answers that end the run without a send:
// nil when there is nothing to do, else the archive error.
func (ad *admission) settled(n tasks.Notification, c check, d throttle.Decision, why string, log *slog.Logger) error {
	var err *tasks.ArchivedError
	switch d.Status {
	case throttle.StatusDone, throttle.StatusDuplicate:
		log.Info("already sent; not sending again")
		return nil
	case throttle.StatusUnknown:
		log.Warn("an earlier attempt may have sent this notification (outcome unknown); at-most-once: archiving, not sending")
		err = tasks.Archived(tasks.ReasonUnknown, errors.New("the outcome of an earlier attempt is unknown (at-most-once)"))
	case throttle.StatusExpired:
		log.Warn("expired: its earliest slot is past its deadline; archiving, not sending", "deadline", c.Deadline, "set_by", c.DeadlineBy, "slot", d.At, "waiting_for", why)
		err = tasks.Archived(tasks.ReasonExpired, fmt.Errorf("the earliest slot (%s, %s) is past the %s deadline %s",
			d.At.UTC().Format(time.RFC3339), why, c.DeadlineBy, c.Deadline.UTC().Format(time.RFC3339)))
	case throttle.StatusBlocked:
		log.Warn("the recipient's consent blocks this send; archiving, not sending", "block", d.BlockReason, "code", d.BlockValue, "since", d.BlockedSince)
		err = tasks.Archived(tasks.ReasonSuppressed, blockedError(n, d))
		ad.fb.fallBack(context.Background(), n, 0, log)
	case throttle.StatusDropped:
		log.Warn("dropped: a rule whose action is drop is full", "rule", why)
		err = tasks.Archived(tasks.ReasonThrottled, fmt.Errorf("%s is full and drops what exceeds it", why))
	default:
		return fmt.Errorf("worker: unexpected limiter status %s", d.Status)
	}
	ad.archived(n, err.Reason)
	return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
}

// check is one call of the limiter for n under c. A slot within
// MaxInlineWait is admitted for its instant when a waiter token is free
// (held, returned with the decision: the caller releases it after its
// wait); without one it is booked through Asynq instead.
//
// replied is when the answer reached this process: the decision was
// taken before it (slotBy).
func (ad *admission) check(ctx context.Context, n tasks.Notification, c check, pk pick, log *slog.Logger) (d throttle.Decision, waiter bool, replied time.Time, held *heldSlot, err error) {
	opts := c.opts
	if opts.Nonce == "" {
		opts.Nonce = nonce() // a retry after a lost reply gets this run's own admission back
	}
	if n.Channel == tasks.SMS && ad.suppressCodes != nil {
		// The suppression list is read in the same script call.
		opts.Block = ad.delivery.SuppressKey(n.Tenant, n.Channel, n.To)
	}
	if n.Channel == tasks.SMS {
		// Whom it goes to (a keyed hash), written with the admission, before
		// the provider can call back: a status callback marks only this
		// number undeliverable.
		opts.Note = ad.delivery.RecipientNote(n.Tenant, n.ID, n.To, ad.cfg.DedupeTTL)
	}
	waiter = ad.wait.tryWaiter()
	if !waiter {
		opts.Horizon = 0
	}
	opts.Seat = takeSeat(ctx)
	// One recipient's checks in the order their tasks were handed out: the
	// place is freed when the run ends (sent, deferred or settled), so a
	// later task to the recipient does not take a slot an earlier one gave
	// back to ask again (a late wake-up).
	placeOf(ctx).wait(ctx)
	held = slotFirst(ctx, pk, c, &opts.Seat, ad.paceOf(), ad.cfg.slowAbove()) // after every wait that holds no slot
	checkCtx, span := ad.startCheck(ctx, c.Limits)
	err = ad.withRedis(checkCtx, log, "quota check", func(ctx context.Context) error {
		var err error
		d, err = ad.limiter.Reserve(ctx, n.Tenant, n.ID, opts, c.Limits...)
		replied = time.Now()
		return err
	})
	if err != nil {
		endCheck(span, d, "", err)
		ad.wait.releaseWaiter(waiter)
		ad.metrics.LimiterError.Inc()
		log.Error("quota check failed; nothing sent, will try again", "err", err, "cause", unavailableWhy(err))
		held.free()
		return d, false, replied, nil, &UnavailableError{Err: err}
	}
	if c.Match.Digest != nil && !c.digestItem && !c.rerun {
		// A digest's carrier has its slot now: the recipient's later
		// items may go on, to join it while it waits (digestBefore).
		placeOf(ctx).done()
	}
	if ad.onDecide != nil {
		ad.onDecide(n, d)
	}
	why := waitReason(d, c.Limits)
	endCheck(span, d, why, nil)
	ad.metrics.Decisions.WithLabelValues(string(n.Channel), ad.categoryLabel(n), why, decisionLabel(d)).Inc()
	if d.Status != throttle.StatusAdmitted || d.Wait == 0 {
		ad.wait.releaseWaiter(waiter)
		waiter = false
	}
	if d.Status != throttle.StatusAdmitted || d.Wait > 0 {
		held.free() // only a send admitted for now keeps its request slot
		held = nil
	}
	return d, waiter, replied, held, nil
}

// reachedProvider settles a re-run whose earlier attempt's outcome is
// unknown (it was admitted, and no done record followed: a crash mid-send)
// from what the provider reported: a status callback recorded for the
// notification means the provider has the message, whatever its status,
// so it is not sent again. It gives back the slot the re-run was just
// given, records the earlier attempt done, and reports true. Without a
// report (none arrived, or the channel has none) the re-run sends, as
// at-least-once says; sluice_unknown_outcomes_total counts both, a resend
// once a run however often it asks again (a late wake-up): *resent says
// whether this run counted it.
func (ad *admission) reachedProvider(ctx context.Context, n tasks.Notification, d throttle.Decision, c check, resent *bool, log *slog.Logger) bool {
	var rec *delivery.Record
	if n.Channel == tasks.SMS {
		var err error
		if rec, err = ad.delivery.Get(ctx, n.Tenant, n.ID); err != nil {
			log.Warn("could not read the provider's report of an earlier attempt; sending again (at-least-once)", "err", err)
		}
	}
	if rec == nil {
		if !*resent {
			*resent = true
			ad.metrics.UnknownOutcomes.WithLabelValues(string(n.Channel), "resent").Inc()
		}
		return false
	}
	ad.rec.release(ctx, n, d.Attempt, c.Limits, log)
	ad.rec.markDone(ctx, n, d.Attempt-1, log)
	ad.metrics.UnknownOutcomes.WithLabelValues(string(n.Channel), "settled").Inc()
	log.Info("an earlier attempt reached the provider (its status report is here); not sending again",
		"status", string(rec.Status), "message_sid", rec.MessageSID, "attempt", d.Attempt-1)
	return true
}

// notNow ends a run whose send the limiter did not admit for now: booked
// or denied, back to Asynq for the slot (or into an open digest); else
// settled.
func (ad *admission) notNow(ctx context.Context, t *asynq.Task, n tasks.Notification, c *check, d throttle.Decision, log *slog.Logger) error {
	why := waitReason(d, c.Limits)
	switch d.Status {
	case throttle.StatusBooked, throttle.StatusDenied:
		if joined, err := ad.dig.digestDeferred(ctx, t, n, c, d, log); joined || err != nil {
			return err // nil: an open digest carries it
		}
		ad.metrics.RetryAfter.WithLabelValues(string(n.Channel)).Observe(d.RetryAfter.Seconds())
		return ad.rec.reschedule(ctx, t, n, d, why, c.wakeBy, log)
	case throttle.StatusDone, throttle.StatusDuplicate:
	default:
		ad.dig.digestSpill(ctx, n, *c, log)
	}
	return ad.settled(n, *c, d, why, log)
}

// reserve asks the limiter, under the plans in force, until the send is
// admitted for now (waiting in process for a near slot), or the run ends:
// a nil admission, with what Asynq is to do (nil: nothing more).
//
// The provider is picked first (pickProvider: the first of the channel's
// that is up and not in tried), and the check is of a send through it.
func (ad *admission) reserve(ctx context.Context, t *asynq.Task, n *tasks.Notification, tried []string, log *slog.Logger) (*admitted, error) {
	resent := false
	var look digestLook  // the first round's, for every round of the run
	var booked *bookedAt // a booking of the round before, kept while it planned again
	for round := 0; ; round++ {
		policy, version := ad.currentPlans()
		c := ad.plan(policy, *n)
		if err := ad.comply(c, n, log); err != nil {
			return nil, err
		}
		placeOf(ctx).wait(ctx) // the recipient's order, before the digest is looked at (digestBefore)
		if joined, err := ad.dig.digestBefore(ctx, t, *n, &c, &look, log); joined || err != nil {
			return nil, err
		}
		order := policy.Providers(n.Tenant, n.Channel)
		pk, again, err := ad.pickFor(ctx, *n, &c, order, tried, booked, log)
		if booked = nil; again {
			continue // the grace or the cooldown is over, or a provider changed state: pick again
		} else if err != nil {
			return nil, err
		}
		c.opts.Nonce = nonce() // this check's: a held send's fence names it (waiter.hold)
		d, waiter, replied, held, err := ad.check(ctx, *n, c, pk, log)
		if err != nil {
			return nil, err
		}
		if d.Attempt > 1 && (d.Status == throttle.StatusAdmitted || d.Status == throttle.StatusBooked) && ad.reachedProvider(ctx, *n, d, c, &resent, log) {
			held.free()
			ad.wait.releaseWaiter(waiter)
			return nil, nil
		}
		if d.Status == throttle.StatusAdmitted || d.Status == throttle.StatusBooked {
			ad.prov.forgetElsewhere(ctx, *n, c, pk, d.Attempt, log)
		}
		switch d.Status {
		case throttle.StatusAdmitted:
			// The send may begin no later than half the send slack after its
			// slot. A slot already past by then — the process was starved
			// after the reply came, or the reply was lost with Redis and the
			// retry got this run's admission back — would crowd the next
			// window: give it back and ask again. (A reply slow to arrive is
			// not seen here: slotBy places the slot at the reply, so that
			// time is covered only by the slack.)
			slot := slotBy(replied, d)
			sendBy := slot.Add(ad.cfg.SendSlack / 2)
			if late := time.Since(sendBy); ad.cfg.SendSlack > 0 && late > 0 {
				held.free()
				ad.wait.releaseWaiter(waiter)
				ad.wait.lateWake(ctx, *n, d, c.Limits, late+ad.cfg.SendSlack/2, log)
				err = errLate
			} else if d.Wait == 0 {
				return ad.admit(ctx, n, &admitted{d: d, c: c, pk: pk, order: order, sendBy: sendBy, slot: held}, log)
			} else {
				err = ad.wait.waitForSlot(ctx, *n, d, c, slot, sendBy, pk.replan, log)
				ad.wait.releaseWaiter(waiter)
			}
			if again, err := afterWait(err, round); again {
				continue
			} else if err != nil {
				return nil, err
			}
			if _, now := ad.currentPlans(); now != version && round < 3 {
				// The plans changed while this send waited: a change holds
				// from the moment it is applied, so place it again under it.
				ad.rec.release(ctx, *n, d.Attempt, c.Limits, log)
				log.Info("tenant plans changed during the wait; checking again", "version", now, "was", version)
				continue
			}
			return ad.admit(ctx, n, &admitted{d: d, c: c, pk: pk, order: order, sendBy: sendBy}, log)
		default:
			if again, err := ad.notAdmitted(ctx, t, *n, &c, pk, d, &booked, log); !again {
				return nil, err
			}
		}
	}
}

// admit ends reserve with a send admitted for now: the digest it carries,
// if any, closed and rendered into n (digestAdmitted).
func (ad *admission) admit(ctx context.Context, n *tasks.Notification, a *admitted, log *slog.Logger) (*admitted, error) {
	if err := ad.dig.digestAdmitted(ctx, n, a.c, a.d, log); err != nil {
		a.slot.free()
		return nil, err
	}
	return a, nil
}

// comply enforces what the rules demand of the notification itself, under
// the same plan as its check: a user where user=required; bulk mail carries a List-Unsubscribe (its
// own, or the rules' default, which it gets here). Producers refuse bulk
// mail without one (the API, sluice enqueue); this is the last line for
// other producers and for a plan that changed since the enqueue.
func (ad *admission) comply(c check, n *tasks.Notification, log *slog.Logger) error {
	if err := c.Match.CheckUser(*n); err != nil {
		ad.archived(*n, tasks.ReasonInvalid)
		log.Warn("archiving a notification without a user: its rules require one (user=required)")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, err), asynq.SkipRetry)
	}
	if n.Channel != tasks.Email {
		return nil
	}
	if n.From != "" && !ad.fromDomains.Allows(n.Tenant, n.From, ad.cfg.SMTPFrom) {
		ad.archived(*n, tasks.ReasonInvalid)
		log.Warn("archiving an email From a domain its tenant may not send from (SLUICE_EMAIL_FROM_DOMAINS)")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, errors.New("from: not at a domain this tenant may send from (SLUICE_EMAIL_FROM_DOMAINS)")), asynq.SkipRetry)
	}
	n.ListUnsubscribe = c.Match.ListUnsubscribe(*n)
	if c.Match.Hosted() {
		ok, err := ad.hostedUnsubscribe(n)
		if err != nil {
			log.Warn("no hosted unsubscribe link for this email", "err", err)
		}
		if !ok && c.Match.Bulk {
			ad.archived(*n, tasks.ReasonInvalid)
			log.Error("archiving bulk mail: its rules ask for a hosted unsubscribe link, and this worker has no SLUICE_UNSUBSCRIBE_URL")
			return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, errors.New("a hosted unsubscribe link is required (unsubscribe=hosted) and SLUICE_UNSUBSCRIBE_URL is not set")), asynq.SkipRetry)
		}
	}
	if err := c.Match.CheckUnsubscribe(*n); err != nil {
		ad.archived(*n, tasks.ReasonInvalid)
		log.Warn("archiving bulk mail without a List-Unsubscribe")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, err), asynq.SkipRetry)
	}
	return nil
}

// route moves a task found in another lane or shard than the rules in
// force route it to (a producer without the rules, or with older ones),
// before any check. The legacy single queue is served in place.
func (ad *admission) route(ctx context.Context, t *asynq.Task, n tasks.Notification, log *slog.Logger) (bool, error) {
	have, _ := asynq.GetQueueName(ctx)
	if have == ad.layout.Legacy() {
		return false, nil
	}
	want := ad.currentPolicy().Queue(ad.layout, n)
	if _, _, ours := ad.layout.Parse(have); !ours || have == want {
		return false, nil
	}
	return true, ad.move(ctx, t, n, have, want, log)
}

// decode opens the task's payload. What can never be sent (bad JSON, a
// channel that does not match the task type, a payload that does not open)
// is archived at once.
func (ad *admission) decode(ctx context.Context, t *asynq.Task) (tasks.Notification, error) {
	taskID, _ := asynq.GetTaskID(ctx)
	n, err := tasks.Open(ad.keys, taskID, t.Type(), t.Payload(), ad.cfg.PayloadPlaintext == "accept")
	if err == nil {
		if typ, _ := n.Channel.TaskType(); typ != t.Type() {
			err = fmt.Errorf("%w: channel %q does not match task type %q", tasks.ErrInvalid, n.Channel, t.Type())
		}
	}
	if err == nil {
		return n, nil
	}
	reason := tasks.ReasonInvalid
	if errors.Is(err, tasks.ErrSealed) || errors.Is(err, tasks.ErrNotSealed) {
		reason = tasks.ReasonUnreadable
	}
	ad.metrics.Sends.WithLabelValues(channelLabel(t.Type()), "invalid").Inc()
	ad.metrics.Archived.WithLabelValues(channelLabel(t.Type()), "", reason).Inc()
	ad.log.Warn("archiving a notification that cannot be sent", "task_id", taskID, "task_type", t.Type(), "reason", err)
	return tasks.Notification{}, fmt.Errorf("%w: %w", tasks.Archived(reason, err), asynq.SkipRetry)
}

// reserveOptions are the limiter options of every check.
func (ad *admission) reserveOptions() throttle.ReserveOptions {
	o := throttle.ReserveOptions{
		Policy:  throttle.AtLeastOnce,
		Slack:   ad.cfg.SendSlack,
		Horizon: ad.cfg.MaxInlineWait,
		Book:    ad.cfg.Reschedule == "booked",
	}
	if ad.cfg.Rerun == "at-most-once" {
		o.Policy = throttle.AtMostOnce
	}
	return o
}

// move re-enqueues a task, under its own id, in the queue the rules route
// it to, and completes it here. Nothing was checked or sent for it yet. A
// move repeated after a crash finds the copy there (its id is taken) and
// completes this one too; a copy already sent is skipped by its done record.
func (ad *admission) move(ctx context.Context, t *asynq.Task, n tasks.Notification, from, to string, log *slog.Logger) error {
	taskID, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	budget := max(0, tasks.RetryBudget(t, maxRetry)-retried)
	headers := map[string]string{}
	for k, v := range t.Headers() {
		headers[k] = v
	}
	headers[tasks.HeaderRetryBudget] = strconv.Itoa(budget)
	_, err := ad.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers),
		asynq.Queue(to), asynq.TaskID(taskID), asynq.MaxRetry(budget+1), asynq.Timeout(tasks.DefaultTimeout), asynq.Retention(0))
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return &UnavailableError{Err: fmt.Errorf("move %s to %s: %w", taskID, to, err)}
	}
	ad.metrics.Moved.WithLabelValues(string(n.Channel)).Inc()
	log.Info("moved to the queue its rules route it to", "from", from, "to", to)
	return nil
}

// serviceWindow archives a free-form WhatsApp message (no template) whose
// recipient has not written to the tenant within WhatsApp's 24-hour
// customer-service window (consent.Store.CheckWindow, read each time the
// task runs): Meta would refuse it (131047), and only a template may start
// the conversation. Redis trouble defers the task, sending nothing.
func (ad *admission) serviceWindow(ctx context.Context, n tasks.Notification, log *slog.Logger) error {
	if n.Channel != tasks.WhatsApp || n.Template != nil {
		return nil
	}
	err := ad.consent.CheckWindow(ctx, n, time.Now())
	switch {
	case err == nil:
		return nil
	case errors.Is(err, consent.ErrWindowClosed):
		ad.archived(n, tasks.ReasonWindow)
		log.Warn("archiving a free-form WhatsApp message: its recipient's customer-service window is closed (no message from it in 24 h); send a template")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonWindow, err), asynq.SkipRetry)
	}
	return &UnavailableError{Err: err}
}

// admitted is a send the limiter admitted for now.
type admitted struct {
	d  throttle.Decision
	c  check // what it was checked under
	pk pick  // the provider it goes to
	// order is its tenant's plan's order of the channel's providers (nil:
	// the configured list).
	order []string
	// sendBy is the latest instant the send may begin, in this process's
	// clock: half the send slack after its slot.
	sendBy time.Time
	// slot is the request slot taken before the check (slotFirst), nil
	// when it took none; dispatch frees it.
	slot *heldSlot
}

// slotBy places an admission's slot in this process's clock. The
// decision was taken before its reply came (Redis's clock may differ from
// this one; the round trip does not), so the slot lies at most the wait
// after the reply, less how far it was already past when it was taken (an
// admission handed back again after a lost reply). slotBy takes that
// latest instant: a send is never early, and late by at most the round
// trip, which the send slack covers. (The round trip's midpoint, used
// before, could be early by half of it: CI saw a send 0.44 ms before its
// slot.)
func slotBy(replied time.Time, d throttle.Decision) time.Time {
	return replied.Add(d.Wait - max(d.Now.Sub(d.At), 0))
}

// nonce names one run of a task's handler.
func nonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// waitReason names what set a slot later than now: a rule, or quiet hours.
func waitReason(d throttle.Decision, limits []throttle.Limit) string {
	switch {
	case d.DeniedBy >= 0:
		return limits[d.DeniedBy].String()
	case d.Wait > 0 && (d.Status == throttle.StatusBooked || d.Status == throttle.StatusAdmitted || d.Status == throttle.StatusExpired):
		return "quiet hours"
	}
	return ""
}

func decisionLabel(d throttle.Decision) string {
	if d.Status == throttle.StatusAdmitted && d.Wait > 0 {
		return "admitted_later"
	}
	return d.Status.String()
}

// check is what the limiter is asked for one notification.
type check struct {
	plans.Check
	opts throttle.ReserveOptions
	// digestItem: checked as a digest's item (no booking, no wait in
	// process; worker/digest.go): it carries no digest.
	digestItem bool
	// rerun: a re-run of a send checked before (digest.Rerun): it joins
	// and opens no digest.
	rerun bool
	// windowEnd: the carrier of a digest with a window is not sent before
	// (digestWindow).
	windowEnd time.Time
	// wakeBy: a provider passed over for the one picked may come back then
	// (pick.replanAt): a send booked past it is woken to be in process by
	// then, and plans again at once.
	wakeBy time.Time
}

// notAdmitted ends a round whose send the limiter did not admit for now:
// again when the send plans again — booked at a later provider of its list
// with an earlier one that may come back before the slot (waitForReplan;
// *booked keeps the booking meanwhile), or its digest's carrier now
// (errOpened), asked again with a booking — else the run ends with err.
func (ad *admission) notAdmitted(ctx context.Context, t *asynq.Task, n tasks.Notification, c *check, pk pick, d throttle.Decision, booked **bookedAt, log *slog.Logger) (again bool, err error) {
	ad.prov.giveBackProbe(ctx, pk, d, log)
	if ad.prov.heldAsPicked(ctx, n, *c, pk, d, log) {
		ad.rec.release(ctx, n, d.Attempt, c.Limits, log)
		return true, nil
	}
	if d.Status == throttle.StatusBooked && ad.wait.waitForReplan(ctx, pk, d, log) {
		*booked = &bookedAt{p: pk.p, attempt: d.Attempt, limits: c.Limits}
		return true, nil
	}
	if err := ad.notNow(ctx, t, n, c, d, log); !errors.Is(err, errOpened) {
		return false, err
	}
	return true, nil
}

// afterWait says what a wait for the slot that ended with err leaves:
// plan again (a hold began: booked after it, or admitted if it lifted
// meanwhile; a provider ahead changed state; a late wake-up in the first
// rounds), or end the run with err.
func afterWait(err error, round int) (again bool, _ error) {
	switch {
	case errors.Is(err, errHeld), errors.Is(err, errReplan):
		return true, nil
	case errors.Is(err, errLate) && round < 3:
		return true, nil
	case errors.Is(err, errLate):
		retryAt := time.Now().Add(time.Second)
		return false, &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "late wake-ups"}
	}
	return false, err
}

// pickFor picks n's provider for this round (pickProvider) and binds c to
// it. A wait for a provider near enough is waited in process: again, and
// the send picks again; one further ends the run (err: what Asynq is to
// do). booked, the send's booking of the round before, is given back when
// it picked another provider: that booking is not the one it sends on.
func (ad *admission) pickFor(ctx context.Context, n tasks.Notification, c *check, order, tried []string, booked *bookedAt, log *slog.Logger) (pk pick, again bool, err error) {
	pk, err = ad.prov.pickProvider(ctx, n, c.Match.Exempt, order, tried, log)
	if err != nil {
		var pw *errProviderWait
		if errors.As(err, &pw) && ad.wait.waitForProvider(ctx, pw, log) {
			return pick{}, true, nil
		}
		return pick{}, false, ad.prov.providerWait(n, err, log)
	}
	if booked != nil && booked.p != pk.p {
		ad.rec.release(ctx, n, booked.attempt, booked.limits, log)
	}
	ad.prov.bindProvider(c, n, pk.p)
	c.wakeBy = pk.replanAt
	return pk, false, nil
}

// bookedAt is a send's booking at a provider, kept while the send waits
// to plan again (waitForReplan).
type bookedAt struct {
	p       *provider
	attempt int
	limits  []throttle.Limit
}

// blockedError says why the limiter blocked a send.
func blockedError(n tasks.Notification, d throttle.Decision) error {
	since := ""
	if !d.BlockedSince.IsZero() {
		since = " since " + d.BlockedSince.UTC().Format(time.RFC3339)
	}
	code := ""
	if d.BlockValue != 0 {
		code = fmt.Sprintf(" (code %d)", d.BlockValue)
	}
	switch d.BlockReason {
	case throttle.BlockedUndeliverable:
		return fmt.Errorf("the recipient is undeliverable%s%s; not sent", since, code)
	case throttle.BlockedCategory:
		return fmt.Errorf("the recipient opted out of category %s%s; not sent", n.CategoryOrDefault(), since)
	case throttle.BlockedAll:
		return fmt.Errorf("the recipient opted out of every category but the exempt ones%s; not sent", since)
	}
	return fmt.Errorf("an earlier SMS to this recipient failed permanently (provider code %d); not sent", d.BlockValue)
}
