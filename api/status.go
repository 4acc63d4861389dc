package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Status is what GET /v1/notifications/{id} answers.
type Status struct {
	ID       string `json:"id"`
	Tenant   string `json:"tenant"`
	Channel  string `json:"channel,omitempty"`
	Category string `json:"category,omitempty"`
	// To is the recipient, masked ("+1415***0100").
	To string `json:"to,omitempty"`
	// State is queued, waiting, sending, sent, archived or unknown; for an
	// SMS whose provider reported its outcome, delivered, undelivered or
	// failed instead of sent.
	State string `json:"state"`
	// Reason says why a notification waits (throttled, quiet_hours,
	// shutdown, unavailable, retry) or was archived (expired, dropped,
	// outcome_unknown, invalid, unreadable, permanent, retry_budget,
	// suppressed, template: the digest it carries passed a limit of the
	// tenant's template's box).
	Reason string `json:"reason,omitempty"`
	// Rule is the rule that set the slot of a throttled notification, e.g. "sms:recipient 1/1m".
	Rule string `json:"rule,omitempty"`
	// Slot is the instant the limiter holds for the send (booked or admitted).
	Slot time.Time `json:"slot,omitzero"`
	// NextAttemptAt is when the queue hands the task to a worker again.
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	// SentAt is when the worker recorded the send.
	SentAt time.Time `json:"sent_at,omitzero"`
	// Attempt numbers the limiter's admissions of the notification (1 unless
	// an earlier attempt's outcome was unknown).
	Attempt    int       `json:"attempt,omitempty"`
	EnqueuedAt time.Time `json:"enqueued_at,omitzero"`
	ExpiresAt  time.Time `json:"expires_at,omitzero"`
	// Detail is the worker's last message about the task (no recipient in clear).
	Detail string `json:"detail,omitempty"`
	// ProviderStatus is the latest status the provider reported through a
	// status callback (queued, sent, delivered, undelivered, failed, ...).
	ProviderStatus string `json:"provider_status,omitempty"`
	// ErrorCode is the provider's error code with an undelivered or failed
	// status (e.g. 30007, carrier filtering).
	ErrorCode int `json:"error_code,omitempty"`
	// ProviderStatusAt is when Sluice recorded ProviderStatus.
	ProviderStatusAt time.Time `json:"provider_status_at,omitzero"`
	// MessageSID is the provider's id of the message.
	MessageSID string `json:"message_sid,omitempty"`
	// Provider names the provider that took it, where a channel has
	// several (SLUICE_SMS_PROVIDERS, SLUICE_EMAIL_PROVIDERS).
	Provider string `json:"provider,omitempty"`
	// Digest is, with state digested, the id of the notification whose
	// digest carries this one (the plans' digest rule).
	Digest string `json:"digest,omitempty"`
}

// applyDelivery adds what the provider reported about a notification: its
// status and error code, and — when Sluice knows it handed the message over
// (sent), has it in hand (sending) or admitted it without a record of the
// outcome (unknown) — the state the report implies: delivered, undelivered
// or failed for a final status, else sent. Other states stay: a task still
// queued, waiting or archived keeps saying so.
func applyDelivery(st *Status, rec *delivery.Record) {
	if rec == nil {
		return
	}
	st.ProviderStatus, st.ErrorCode, st.ProviderStatusAt, st.MessageSID = string(rec.Status), rec.ErrorCode, rec.At, rec.MessageSID
	switch st.State {
	case StateSent, StateSending, StateUnknown:
		if st.State == StateUnknown {
			st.Detail = ""
		}
		st.State = StateSent
		switch rec.Status.Outcome() {
		case "delivered":
			st.State = StateDelivered
		case "undelivered":
			st.State = StateUndelivered
		case "failed":
			st.State = StateFailed
		}
	}
}

// getNotification is GET /v1/notifications/{id}. A notification of another
// tenant is answered exactly like one that does not exist.
func (s *Server) getNotification(w http.ResponseWriter, r *http.Request) {
	id := identityOf(r)
	tenant := id.Tenant
	if id.Admin {
		tenant = r.URL.Query().Get("tenant") // optional: finds sent notifications
	} else if q := r.URL.Query().Get("tenant"); q != "" && q != tenant {
		s.notFound(w)
		return
	}
	nid := r.PathValue("id")
	if tasks.CheckID(nid) != nil {
		s.notFound(w)
		return
	}
	st, found, err := s.status(r.Context(), tenant, id.Admin, nid)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	if !found {
		s.notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) notFound(w http.ResponseWriter) {
	writeProblem(w, http.StatusNotFound, "not-found", "no notification with this id for this token")
}

// status finds a notification: in the queue (its payload opened to learn
// its tenant), else by the limiter's record in tenant's group (a sent
// notification is no longer queued: Asynq keeps no completed task). tenant
// is the caller's; for the admin it may be empty, and then only queued
// notifications are found.
func (s *Server) status(ctx context.Context, tenant string, admin bool, id string) (Status, bool, error) {
	info, err := s.cfg.Layout().FindTask(s.insp, tenant, s.policy().Pins(), id)
	switch {
	case err == nil:
		return s.taskStatus(ctx, tenant, admin, info)
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
	default:
		return Status{}, false, err
	}
	if tenant == "" {
		return Status{}, false, nil
	}
	carrier, err := s.digests.CarriedBy(ctx, tenant, id)
	if err != nil {
		return Status{}, false, err
	}
	if carrier != "" {
		return Status{ID: id, Tenant: tenant, State: StateDigested, Digest: carrier}, true, nil
	}
	rec, err := s.lim.Record(ctx, tenant, id)
	if err != nil || rec == nil {
		return Status{}, false, err
	}
	st := Status{ID: id, Tenant: tenant, Attempt: rec.Attempt}
	switch rec.Kind {
	case throttle.RecordDone:
		st.State, st.SentAt = StateSent, rec.At
	case throttle.RecordBooked:
		// Booked, and the task is not under its own id: a copy rescheduled
		// by the worker holds it.
		st.State, st.Reason, st.Slot = StateWaiting, "throttled", rec.At
	default:
		st.State, st.Slot = StateUnknown, rec.At
		st.Detail = "admitted for sending; no record of the outcome yet"
	}
	dlv, err := s.delivery.Get(ctx, tenant, id)
	if err != nil {
		return Status{}, false, err
	}
	applyDelivery(&st, dlv)
	if st.Provider, err = s.delivery.Provider(ctx, tenant, id); err != nil {
		return Status{}, false, err
	}
	return st, true, nil
}

func (s *Server) taskStatus(ctx context.Context, tenant string, admin bool, info *asynq.TaskInfo) (Status, bool, error) {
	n, err := tasks.Open(s.keys, info.ID, info.Type, info.Payload, s.cfg.PayloadPlaintext == "accept")
	if err != nil {
		if !admin {
			return Status{}, false, nil // cannot tell whose it is: not the caller's
		}
		st := Status{ID: info.ID, Tenant: tenant, State: StateUnknown, Reason: "unreadable", Detail: info.LastErr}
		if info.State == asynq.TaskStateArchived {
			st.State = StateArchived
		}
		return st, true, nil
	}
	if n.Tenant != tenant && !(admin && tenant == "") {
		return Status{}, false, nil
	}
	st := Status{ID: n.ID, Tenant: n.Tenant, Channel: string(n.Channel), Category: n.CategoryOrDefault(), To: tasks.Mask(n.To),
		EnqueuedAt: n.EnqueuedAt, ExpiresAt: n.ExpiresAt, Detail: info.LastErr}
	rec, err := s.lim.Record(ctx, n.Tenant, n.ID)
	if err != nil {
		return Status{}, false, err
	}
	if rec != nil {
		st.Attempt = rec.Attempt
		if rec.Kind == throttle.RecordBooked || rec.Kind == throttle.RecordAdmitted {
			st.Slot = rec.At
		}
	}
	switch info.State {
	case asynq.TaskStatePending, asynq.TaskStateAggregating: // dispatched, or in its tenant's waiting room
		st.State = StateQueued
		if rec != nil && rec.Kind == throttle.RecordDone {
			st.State, st.SentAt, st.Slot = StateSent, rec.At, time.Time{}
		}
	case asynq.TaskStateScheduled, asynq.TaskStateRetry:
		st.State, st.NextAttemptAt = StateWaiting, info.NextProcessAt.UTC()
		if info.LastErr == "" {
			st.State = StateQueued // enqueued to be sent later
			break
		}
		le := tasks.ReadTaskError(info.LastErr, true)
		st.Reason, st.Rule = le.Reason, le.Rule
		if st.Slot.IsZero() && !le.Until.IsZero() {
			st.Slot = le.Until
		}
	case asynq.TaskStateActive:
		st.State = StateSending
		if rec != nil && rec.Kind == throttle.RecordDone {
			st.State, st.SentAt, st.Slot = StateSent, rec.At, time.Time{}
		}
	case asynq.TaskStateArchived:
		st.State = StateArchived
		st.Reason = tasks.ReadTaskError(info.LastErr, false).Reason
		st.Slot = time.Time{}
	case asynq.TaskStateCompleted:
		st.State, st.SentAt, st.Slot = StateSent, info.CompletedAt.UTC(), time.Time{}
	default:
		st.State = StateUnknown
	}
	if n.Channel == tasks.SMS && rec != nil {
		dlv, err := s.delivery.Get(ctx, n.Tenant, n.ID)
		if err != nil {
			return Status{}, false, err
		}
		applyDelivery(&st, dlv)
	}
	if st.State == StateSent || st.State == StateDelivered || st.State == StateUndelivered || st.State == StateFailed {
		if st.Provider, err = s.delivery.Provider(ctx, n.Tenant, n.ID); err != nil {
			return Status{}, false, err
		}
	}
	return st, true, nil
}
