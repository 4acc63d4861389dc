package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/unsubscribe"
)

// consentCheck is what the limiter reads of n's recipient's consent in the
// same script call as the quota check: their suppression hash, whether the
// category is one an opt-out of every category lets through, and, under
// optout=category for SMS, where to remember the category for a keyword
// opt-out. nil for a recipient that cannot be keyed.
func (w *Worker) consentCheck(p plans.Policy, n tasks.Notification) *throttle.ConsentCheck {
	key := w.consent.Key(n.Tenant, n.Channel, n.To)
	if key == "" {
		return nil
	}
	cat := n.CategoryOrDefault()
	cc := &throttle.ConsentCheck{Key: key, Category: cat, Exempt: p.ConsentExempt(n.Tenant, n.Channel, cat)}
	if n.Channel == tasks.SMS && p.Consent(n.Tenant, n.Channel).OptOut == plans.OptOutCategory && cat != plans.ReplyCategory {
		cc.LastKey, cc.LastTTL = w.consent.LastKey(n.Tenant, n.Channel, n.To), consent.LastCategoryTTL
	}
	return cc
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

// hostedUnsubscribe gives an email of a category whose rules ask for
// hosted links (unsubscribe=hosted) Sluice's one-click link, unless it
// carries an https URL of its own (that one stays; a mailto: of its own is
// kept beside the hosted link). It returns false when it cannot: no
// SLUICE_UNSUBSCRIBE_URL.
func (w *Worker) hostedUnsubscribe(n *tasks.Notification) (bool, error) {
	own, _ := tasks.ParseListUnsubscribe(n.ListUnsubscribe)
	if n.ListUnsubscribe != "" && own.HTTPS != "" {
		return true, nil
	}
	if w.unsubscribe == nil {
		return false, nil
	}
	subject, err := w.consent.Subject(n.Tenant, tasks.Email, n.To)
	if err != nil {
		return false, err
	}
	link, err := w.unsubscribe.URL(w.cfg.UnsubscribeURL, unsubscribe.Link{Tenant: n.Tenant, Category: n.CategoryOrDefault(), Subject: subject})
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

// suppress records what a provider's refusal says of the recipient: it
// cannot take messages any more (an invalid or unsubscribed number, a
// mailbox that does not exist), in the recipient's consent for the tenant,
// for the refusal's SuppressFor.
func (w *Worker) suppress(ctx context.Context, n tasks.Notification, se *sender.SendError, log *slog.Logger) {
	if !se.Suppress || (n.Channel == tasks.SMS && w.suppressCodes == nil) {
		return
	}
	ctx, cancel := w.afterSendContext(ctx)
	defer cancel()
	source, ttl := consent.SourceProvider, w.cfg.SMSSuppressTTL
	if n.Channel == tasks.Email {
		source, ttl = consent.SourceBounce, w.cfg.EmailSuppressTTL
	}
	if se.SuppressFor > 0 {
		ttl = se.SuppressFor
	}
	var until time.Time
	err := w.withRedis(ctx, log, "suppressing a recipient", func(ctx context.Context) error {
		e, err := w.consent.Record(ctx, n.Tenant, n.Channel, n.To, consent.Event{Action: consent.Undeliverable, Source: source,
			Code: se.Code, Until: time.Now().Add(ttl), Ref: n.ID})
		until = e.Until
		return err
	})
	if err != nil {
		log.Warn("could not mark the recipient undeliverable", "code", se.Code, "err", err)
		return
	}
	w.metrics.Suppressed.WithLabelValues(string(n.Channel), string(source)).Inc()
	log.Info("recipient marked undeliverable for the tenant", "code", se.Code, "until", until)
}
