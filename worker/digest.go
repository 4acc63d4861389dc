package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// digester folds deferred sends into digests: the open digest of a
// recipient, category and key carries the items that come while it waits,
// and its carrier renders them as one message at its slot.
type digester struct {
	*core
	digests   *digest.Store
	templates *digest.Templates
	rec       *records
}

// Digests (package digest): a notification of a digested category joins
// the open digest of its recipient before any check (its task is then
// done); one its rules defer opens a digest and carries it to its slot,
// where it closes the digest and is sent as the message of every item.

// digestItem is t as a digest keeps it.
func digestItem(ctx context.Context, t *asynq.Task, n tasks.Notification) digest.Item {
	id, _ := asynq.GetTaskID(ctx)
	if id == "" {
		id = n.ID
	}
	return digest.Item{TaskID: id, Type: t.Type(), Payload: t.Payload()}
}

// digestTTL is how long a digest's items live: past any slot its carrier
// may be booked for, and its re-runs.
func digestTTL(c check) time.Duration { return 2*c.opts.StateTTL + 24*time.Hour }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// errOpened: n opened a digest after a check that booked nothing (an
// item's); it is asked again, with a booking, as the digest's carrier.
var errOpened = errors.New("opened a digest: asking again for its slot")

// digestSpill hands the other items of the digest n carried back to the
// queue when n ends without a send (expired, dropped, blocked, archived):
// each is placed again on its own.
func (dgs *digester) digestSpill(ctx context.Context, n tasks.Notification, c check, log *slog.Logger) {
	if c.Match.Digest == nil || c.digestItem {
		return
	}
	items, err := dgs.digests.Close(ctx, n, *c.Match.Digest)
	if err != nil || len(items) < 2 {
		if err != nil {
			log.Error("digest: could not read the items of a digest that will not be sent", "err", err)
		}
		return
	}
	policy := dgs.currentPolicy()
	type back struct {
		it digest.Item
		n  tasks.Notification
	}
	var backs []back
	var ids []string
	for _, it := range items[1:] {
		m, err := dgs.openItem(it)
		if err != nil {
			log.Error("digest: an item does not open; not handed back", "item_task", it.TaskID, "err", err)
			continue
		}
		backs = append(backs, back{it, m})
		ids = append(ids, m.ID)
	}
	// Their notes go first: an item handed back with its note would be
	// Joined to this digest again (Join keeps a re-run's join) and lost.
	if err := dgs.digests.Release(ctx, n, ids); err != nil {
		log.Error("digest: could not release the items of a digest that will not be sent; kept for the next run", "err", err)
		return
	}
	for _, b := range backs {
		_, err := dgs.client.EnqueueContext(ctx, asynq.NewTask(b.it.Type, b.it.Payload), asynq.Queue(policy.Queue(dgs.layout, b.n)),
			asynq.TaskID(b.it.TaskID), asynq.MaxRetry(tasks.DefaultMaxRetry+1), asynq.Timeout(tasks.DefaultTimeout), asynq.Retention(0))
		if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			log.Error("digest: could not hand an item back to the queue; kept for the next run", "item", b.n.ID, "err", err)
			return // Forget below would lose it: the carrier's re-run (if any) tries again
		}
	}
	if err := dgs.digests.Forget(ctx, n); err != nil {
		log.Warn("digest: items handed back, but their digest's record stays until its TTL", "err", err)
	}
	dgs.metrics.Digested.WithLabelValues(string(n.Channel), "spilled").Add(float64(len(ids)))
	log.Info(fmt.Sprintf("its digest will not be sent: %d items handed back to the queue", len(ids)))
}

// openItems opens a digest's items, the carrier (n, already open) first,
// leaving out those past their expiry and, logged, any that do not open.
func (dgs *digester) openItems(n tasks.Notification, items []digest.Item, log *slog.Logger) (carried []tasks.Notification, expired int) {
	carried = append(carried, n)
	now := time.Now()
	for _, it := range items[1:] {
		m, err := dgs.openItem(it)
		if err != nil {
			log.Error("digest: an item does not open; left out", "item_task", it.TaskID, "err", err)
			continue
		}
		if !m.ExpiresAt.IsZero() && m.ExpiresAt.Before(now) {
			expired++
			continue
		}
		carried = append(carried, m)
	}
	return carried, expired
}

// openItem opens one item of a digest as its task was queued.
func (dgs *digester) openItem(it digest.Item) (tasks.Notification, error) {
	return tasks.Open(dgs.keys, it.TaskID, it.Type, it.Payload, dgs.cfg.PayloadPlaintext == "accept")
}

// digestFailed ends a digest whose tenant template passed a limit of its
// box (digest.ErrLimit): nothing is sent, the slot is given back, and the
// carrier is archived with reason template; its items stay in the digest,
// whose state (the carrier's, GET /v1/notifications/{id}) says why.
// Another render would pass the same limit: the digest is not tried again.
func (dgs *digester) digestFailed(ctx context.Context, n tasks.Notification, items int, c check, d throttle.Decision, err error, log *slog.Logger) error {
	dgs.rec.release(ctx, n, d.Attempt, c.Limits, log)
	dgs.archived(n, tasks.ReasonTemplate)
	dgs.metrics.Digested.WithLabelValues(string(n.Channel), "failed").Add(float64(items))
	log.Warn("digest: the tenant's template passed a limit of its box; the digest is archived unsent", "items", items, "err", err)
	return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonTemplate, err), asynq.SkipRetry)
}

// digestAdmitted closes the digest n carries, if any, as n is admitted, and
// makes n the message of its items. A failure to read them gives the slot
// back: the task is tried again.
func (dgs *digester) digestAdmitted(ctx context.Context, n *tasks.Notification, c check, d throttle.Decision, log *slog.Logger) error {
	if c.Match.Digest == nil || c.digestItem {
		return nil // an item checked as one carries no digest: nothing to close
	}
	var items []digest.Item
	err := dgs.withRedis(ctx, log, "digest", func(ctx context.Context) error {
		var err error
		items, err = dgs.digests.Close(ctx, *n, *c.Match.Digest)
		return err
	})
	if err != nil {
		dgs.rec.release(ctx, *n, d.Attempt, c.Limits, log)
		dgs.metrics.LimiterError.Inc()
		log.Error("digest: could not read its items; nothing sent, will try again", "err", err)
		return &UnavailableError{Err: err}
	}
	if len(items) < 2 {
		return nil // no digest, or one nothing joined: n goes as it is
	}
	carried, expired := dgs.openItems(*n, items, log)
	tmpl, err := dgs.templates.Get(ctx, n.Tenant, n.Channel, n.Category)
	if err != nil {
		log.Warn("digest: could not read the tenant's template; the built-in one goes", "err", err)
	}
	msg, err := digest.RenderWith(*n, carried, tmpl)
	if errors.Is(err, digest.ErrLimit) {
		return dgs.digestFailed(ctx, *n, len(carried), c, d, err, log)
	}
	if err != nil && tmpl != nil {
		log.Error("digest: the tenant's template failed; the built-in one goes", "err", err)
		msg, err = digest.Render(*n, carried)
	}
	if err != nil {
		log.Error("digest: its template failed; sending the carrier's own message", "err", err)
		return nil
	}
	*n = msg
	dgs.metrics.Digested.WithLabelValues(string(n.Channel), "sent").Add(float64(len(carried)))
	dgs.metrics.Digested.WithLabelValues(string(n.Channel), "expired").Add(float64(expired))
	dgs.metrics.DigestItems.WithLabelValues(string(n.Channel)).Observe(float64(len(carried)))
	log.Info("sending a digest", "items", len(carried), "expired", expired)
	return nil
}

// digestDeferred is the join of n that its rules defer (d): it joins a
// digest opened since its first look (its task is done: true), or opens one
// and carries it — errOpened when it was checked as an item (nothing
// booked): it is asked again as the carrier.
func (dgs *digester) digestDeferred(ctx context.Context, t *asynq.Task, n tasks.Notification, c *check, d throttle.Decision, log *slog.Logger) (bool, error) {
	if c.Match.Digest == nil || c.rerun {
		return false, nil // a re-run repeats its earlier send: it opens no digest
	}
	o, err := dgs.joinDigest(ctx, t, n, c, true, false, log)
	out := o.Kind
	switch {
	case err != nil && !d.Booked:
		dgs.metrics.LimiterError.Inc()
		log.Error("digest: could not open a digest; nothing sent, will try again", "err", err)
		return false, &UnavailableError{Err: err}
	case err != nil:
		log.Warn("digest: could not open a digest; waiting for a slot of its own", "err", err)
		return false, nil
	case out == digest.Joined && d.Booked:
		dgs.rec.release(ctx, n, d.Attempt, c.Limits, log)
	case out == digest.Started && c.digestItem:
		return false, errOpened
	}
	return out == digest.Joined, nil
}

// digestLook is what the first round of a run found when it looked at
// the digests: it holds for the run's later rounds.
type digestLook struct {
	looked    bool
	rerun     bool      // check.rerun
	windowEnd time.Time // check.windowEnd
}

// digestBefore is the join before n's check, in the first round of its
// run only (later rounds get what it found): false, nil when n goes on to
// its check. It comes after n's wait for its recipient's order
// (recipientOrder): the item before it has sent, or opened a digest and
// booked its carrier's slot (admission.check frees its place), which n
// joins.
func (dgs *digester) digestBefore(ctx context.Context, t *asynq.Task, n tasks.Notification, c *check, look *digestLook, log *slog.Logger) (bool, error) {
	if look.looked {
		c.rerun = look.rerun
		if !look.windowEnd.IsZero() {
			c.windowEnd, c.opts.NotBefore = look.windowEnd, later(c.opts.NotBefore, look.windowEnd)
		}
		return false, nil
	}
	if c.Match.Digest == nil {
		look.looked = true
		return false, nil
	}
	o, err := dgs.joinDigest(ctx, t, n, c, c.Match.Digest.Window > 0, true, log)
	if err != nil {
		dgs.metrics.LimiterError.Inc()
		log.Error("digest: could not read the open digest; nothing sent, will try again", "err", err)
		return false, &UnavailableError{Err: err}
	}
	*look = digestLook{looked: true, rerun: c.rerun, windowEnd: c.windowEnd}
	return o.Kind == digest.Joined, nil
}

// joinDigest puts n into the open digest of its recipient, category and
// group when one has room (digest.Joined: its task is done), else, with
// start, opens one that n carries (digest.Started). With a window, the
// first item opens the digest at once and waits the window for its slot
// (c.opts.NotBefore). On the first look of a run (first), a notification
// checked for a send of its own before — a crash came after its admission
// — is a re-run of that send (digest.Rerun, c.rerun): it joins and opens
// nothing, so what reaches the recipient again is that same message, and
// its check settles it from the provider's report when there is one
// (reachedProvider).
func (dgs *digester) joinDigest(ctx context.Context, t *asynq.Task, n tasks.Notification, c *check, start, first bool, log *slog.Logger) (digest.Outcome, error) {
	dg := c.Match.Digest
	var o digest.Outcome
	join := dgs.digests.Join
	if first {
		join = dgs.digests.JoinFirst
	}
	err := dgs.withRedis(ctx, log, "digest", func(ctx context.Context) error {
		var err error
		o, err = join(ctx, n, *dg, digestItem(ctx, t, n), digestTTL(*c), start)
		return err
	})
	if err != nil {
		return o, err
	}
	switch o.Kind {
	case digest.Open:
		// Not a carrier: asked without a booking. Only a carrier books (as
		// it opens a digest): an item that would book, then join a digest and
		// give its slot back, would push a carrier opened meanwhile a slot
		// later.
		// Nor is it admitted for a slot ahead (to wait for it in process):
		// an item its rules defer, however near, goes into a digest.
		c.opts.Book, c.opts.Horizon, c.digestItem = false, 0, true
	case digest.Rerun:
		c.rerun = true
		log.Info("checked for a send of its own before: repeating that send, in no digest")
	case digest.Joined:
		if !o.Again {
			dgs.metrics.Digested.WithLabelValues(string(n.Channel), "joined").Inc()
		}
		log.Info("carried by a digest", "digest", o.Carrier, "again", o.Again)
	case digest.Started:
		// Its carrier now: the recipient's later items go on (recipientOrder)
		// once its check has booked its slot, and join it while it waits
		// for the slot (admission.check frees its place). Not before: a
		// later item that finds this digest full opens the next one, and
		// its carrier must not book ahead of this one's (beside two CPU
		// hogs a starved first carrier was booked 5 s after the second).
		log.Info("opened a digest; it carries the notifications that follow to its slot", "max", dg.Max, "window", dg.Window)
		if o.Opened.IsZero() {
			o.Opened = time.Now() // not from Redis (it always is): this process's clock
		}
		digestWindow(c, o.Opened)
	case digest.Carrier:
		digestWindow(c, o.Opened) // every run of the carrier: its booking alone is not kept
	}
	return o, nil
}

// digestWindow holds the carrier of a digest opened at opened (Redis's
// clock, to the microsecond) until its window (window:D) has passed: the
// slot is at least D after the first item reached a worker, itself after
// its enqueue. The limiter takes whole milliseconds: rounded up, never
// early. Nothing without a window, or when the opening is not known.
func digestWindow(c *check, opened time.Time) {
	dg := c.Match.Digest
	if dg == nil || dg.Window <= 0 || opened.IsZero() {
		return
	}
	end := opened.Add(dg.Window)
	if ms := end.Truncate(time.Millisecond); !ms.Equal(end) {
		end = ms.Add(time.Millisecond)
	}
	c.windowEnd = end
	c.opts.NotBefore = later(c.opts.NotBefore, end)
}
