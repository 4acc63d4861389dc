package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// MaxBatch is the most notifications one request may carry.
const MaxBatch = 500

// Accepted is one notification the API took.
type Accepted struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	// State is the notification's state when answered: queued for a new
	// one; for a retry of an Idempotency-Key whose notification exists
	// already, its state then.
	State string `json:"state"`
}

// BatchAccepted answers a batch, in the order of the request.
type BatchAccepted struct {
	Notifications []Accepted `json:"notifications"`
}

// createNotifications is POST /v1/notifications: one notification (a JSON
// object) or a batch ({"notifications": [...]}), all or nothing.
func (s *Server) createNotifications(w http.ResponseWriter, r *http.Request) {
	c := &creation{s: s, r: r, id: identityOf(r)}
	var ok bool
	if c.tenant, ok = s.tenantOf(w, r, c.id); !ok || !acceptsJSONBody(w, r) {
		return
	}
	var err error
	if c.key, c.hasKey, err = ParseIdempotencyKey(r.Header); err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-request", err.Error(), InvalidParam{Name: HeaderIdempotencyKey, Reason: err.Error()})
		return
	}
	if c.hasKey {
		if w, ok = c.beginIdempotent(w); !ok {
			return
		}
		defer c.endIdempotent()
	}
	body, ok := s.readBody(w, r)
	if !ok || !c.processing(w, body) || refuseAmbiguous(w, body) {
		return
	}
	items, batch, problem := splitBatch(body)
	if problem != nil {
		writeProblem(w, problem.Status, "invalid-request", problem.Detail, problem.InvalidParams...)
		return
	}
	ns, ok := c.decode(w, items, batch)
	if !ok || !c.withinRate(w, len(ns)) {
		return
	}
	// The request is whole: enqueue it even if the client goes away meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.ReadTimeout)
	defer cancel()
	out, err := s.enqueue(ctx, ns, c.hasKey)
	if !c.enqueued(w, err) {
		return
	}
	c.batch, c.out = batch, out
	if !batch {
		w.Header().Set("Location", "/v1/notifications/"+out[0].ID)
		writeJSON(w, http.StatusAccepted, out[0])
		return
	}
	writeJSON(w, http.StatusAccepted, BatchAccepted{Notifications: out})
}

// acceptsJSONBody answers 415 unless the request says its body is JSON
// in UTF-8.
func acceptsJSONBody(w http.ResponseWriter, r *http.Request) bool {
	if mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" ||
		(params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8")) {
		w.Header().Set("Accept-Post", "application/json")
		writeProblem(w, http.StatusUnsupportedMediaType, "unsupported-media", "send the notifications as Content-Type: application/json (UTF-8)")
		return false
	}
	return true
}

// creation is one POST /v1/notifications on its way.
type creation struct {
	s      *Server
	r      *http.Request
	id     identity
	tenant string
	// The Idempotency-Key, if any; its record's Redis key, the owner
	// nonce of this attempt, the body's fingerprint, and whether the
	// answer was kept for retries (else the record is let go).
	key, rkey, owner, fp string
	hasKey, kept         bool
	// What the record keeps of the answer.
	batch bool
	out   []Accepted
}

// beginIdempotent takes the Idempotency-Key's record for this attempt,
// or answers a retry from it (false). The writer it returns keeps a 202
// in the record before the client sees it.
func (c *creation) beginIdempotent(w http.ResponseWriter) (http.ResponseWriter, bool) {
	c.rkey = IdempotencyRedisKey(c.tenant, c.key)
	rec, mine, err := c.s.idem.begin(c.r.Context(), c.rkey)
	if err != nil {
		c.s.unavailable(w, c.r, err)
		return w, false
	}
	if rec != nil {
		c.s.answerRetry(w, c.r, rec, c.tenant, c.key)
		return w, false
	}
	c.owner = mine
	return &keeper{ResponseWriter: w, onAccepted: c.keep}, true
}

// keep records an accepted answer for the key's retries.
func (c *creation) keep(status int, h http.Header, body []byte) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.r.Context()), 5*time.Second)
	defer cancel()
	rec := &idemRecord{State: stateDone, Status: status, At: time.Now().UTC(), Fingerprint: c.fp}
	if !compactAnswer(rec, c.tenant, c.key, c.batch, c.out) {
		rec.ContentType, rec.Location, rec.Body = h.Get("Content-Type"), h.Get("Location"), body
	}
	if err := c.s.idem.update(ctx, c.rkey, c.owner, rec, c.s.cfg.IdempotencyTTL); err != nil {
		c.s.log.Error("could not keep the response of an Idempotency-Key; a retry will map to the same notification ids", "err", err)
	}
	c.kept = true
}

// endIdempotent lets the key's record go when nothing was kept to
// replay: a retry may go ahead.
func (c *creation) endIdempotent() {
	if c.kept {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.r.Context()), 5*time.Second)
	defer cancel()
	_ = c.s.idem.update(ctx, c.rkey, c.owner, nil, 0)
}

// processing records, for a keyed request, that this body is being
// processed (a retry with another body is refused meanwhile).
func (c *creation) processing(w http.ResponseWriter, body []byte) bool {
	if !c.hasKey {
		return true
	}
	c.fp = fingerprint(c.r, body)
	rec := &idemRecord{State: stateProcessing, Owner: c.owner, Fingerprint: c.fp, At: time.Now().UTC()}
	if err := c.s.idem.update(c.r.Context(), c.rkey, c.owner, rec, 0); err != nil {
		c.s.unavailable(w, c.r, err)
		return false
	}
	return true
}

// decode reads every item into a notification of the request's tenant,
// with its id, or answers 403 (an item names another tenant) or 422 (every
// bad field, by pointer and index).
func (c *creation) decode(w http.ResponseWriter, items []json.RawMessage, batch bool) ([]tasks.Notification, bool) {
	ns := make([]tasks.Notification, len(items))
	var invalid, forbidden []InvalidParam
	now := time.Now()
	for i, raw := range items {
		prefix, idx := "", (*int)(nil)
		if batch {
			prefix, idx = "/notifications/"+strconv.Itoa(i), &i
		}
		d := decodeNotification(raw, now)
		n := d.N
		if n.Tenant != "" && n.Tenant != c.tenant {
			forbidden = append(forbidden, bodyParam("tenant", fmt.Sprintf("names tenant %q; this request acts for %q", n.Tenant, c.tenant), prefix+d.pointer("tenant", "")))
			forbidden[len(forbidden)-1].Index = idx
		}
		n.Tenant = c.tenant
		if c.hasKey {
			n.ID = NotificationID(c.tenant, c.key, i)
		} else {
			n.ID = tasks.NewID()
		}
		n.EnqueuedAt = now.UTC().Truncate(time.Millisecond)
		bad := d.Bad
		if len(bad) == 0 {
			bad = c.s.checkPlan(d, &n)
		}
		if len(bad) == 0 {
			bad = c.s.checkWindow(c.r.Context(), d, &n)
		}
		for _, b := range bad {
			b.Index, b.Pointer = idx, prefix+b.Pointer
			invalid = append(invalid, b)
		}
		ns[i] = n
	}
	if len(forbidden) > 0 {
		writeProblem(w, http.StatusForbidden, "forbidden", "a token acts for its own tenant only (an admin token for the tenant named by ?tenant=); nothing was enqueued", forbidden...)
		return nil, false
	}
	if len(invalid) > 0 {
		detail := fmt.Sprintf("%d invalid fields; nothing was enqueued", len(invalid))
		writeProblem(w, http.StatusUnprocessableEntity, "invalid-notification", detail, invalid...)
		return nil, false
	}
	return ns, true
}

// withinRate counts n notifications against the token's notification rate
// (a batch counts each), or answers 429.
func (c *creation) withinRate(w http.ResponseWriter, n int) bool {
	wait, ok, err := c.s.notificationRate(c.r.Context(), c.id.TokenID, n)
	if err != nil {
		c.s.unavailable(w, c.r, err)
		return false
	}
	if !ok {
		w.Header().Set("Retry-After", retryAfter(wait))
		writeProblem(w, http.StatusTooManyRequests, "rate-limited", fmt.Sprintf("this token may enqueue %s notifications; these %d fit in %v; nothing was enqueued", c.s.notifRate, n, wait.Round(time.Millisecond)))
		return false
	}
	return true
}

// enqueued answers an enqueue's error, if any: 429 queue-full at the
// tenant's cap, 422 for an expiry that passed meanwhile, else 503.
func (c *creation) enqueued(w http.ResponseWriter, err error) bool {
	var full *tasks.QueueFullError
	var fe *tasks.FieldError
	switch {
	case err == nil:
		return true
	case errors.As(err, &full):
		c.s.metrics.queueFull.WithLabelValues(full.Cap).Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(QueueFullRetry/time.Second)))
		writeProblem(w, http.StatusTooManyRequests, "queue-full", full.Error()+"; try again when some have been sent")
	case errors.As(err, &fe):
		// Checked above; only time can make it fail now (an expiry that passed).
		writeProblem(w, http.StatusUnprocessableEntity, "invalid-notification", "nothing was enqueued",
			bodyParam(fe.Name(), fe.Reason, ""))
	default:
		c.s.unavailable(w, c.r, err)
	}
	return false
}

// enqueue enqueues every notification or none, even with workers running.
// One notification is enqueued as it is. A batch goes through a
// tasks.Batch: each item is enqueued held (scheduled tasks.BatchHold
// ahead), so no worker can take one while the rest are enqueued; once all
// are in they are released together, in order. On a failure part-way the
// held items are deleted — no worker can have sent one — and a retry
// (with an Idempotency-Key, the same ids) enqueues the batch afresh,
// adopting items an earlier attempt left held. Items an abort could not
// delete (Redis gone) are deleted in the background until the hold is
// nearly over.
func (s *Server) enqueue(ctx context.Context, ns []tasks.Notification, keyed bool) ([]Accepted, error) {
	out := make([]Accepted, len(ns))
	policy, layout := s.policy(), s.cfg.Layout()
	batch := tasks.NewBatch(s.client, s.rdb, s.keys)
	held := len(ns) > 1
	// The tenant's caps on queued work, for the whole request at once:
	// past one nothing is enqueued. Ids this request does not enqueue after
	// all (failed, sent already) are taken out again.
	if err := s.deps.Queued.Reserve(ctx, ns...); err != nil {
		return nil, err
	}
	var uncount []string
	defer func() { s.uncount(ctx, ns[0].Tenant, uncount) }()
	adopted := map[string]bool{} // held by an earlier attempt: queued, and counted, whatever this one does
	abort := func() {
		for _, n := range ns {
			if !adopted[n.ID] {
				uncount = append(uncount, n.ID)
			}
		}
		s.abort(batch)
	}
	items, at, sent, err := s.toEnqueue(ctx, ns, keyed, out)
	uncount = append(uncount, sent...)
	if err != nil {
		abort()
		return nil, err
	}
	if held && keyed {
		if ok, err := s.enqueueAll(ctx, items); err != nil {
			abort()
			return nil, err
		} else if ok {
			return out, nil
		}
	}
	res, err := s.enqueueItems(ctx, batch, items, held)
	if err != nil {
		abort()
		return nil, err
	}
	var fresh []tasks.Channel // what this request enqueued, for the metric
	for k, r := range res {
		i, n := at[k], ns[at[k]]
		switch {
		case keyed && errors.Is(r.Err, tasks.ErrDuplicate):
			st, found, serr := s.status(ctx, n.Tenant, false, n.ID)
			if serr != nil {
				abort()
				return nil, serr
			}
			if found {
				out[i].State = st.State
			}
			if held {
				batch.Adopt(policy.Queue(layout, n), n.Tenant, n.ID) // left held by an earlier attempt: released with this one
				adopted[n.ID] = true
			}
		case r.Err != nil:
			abort()
			return nil, r.Err
		default:
			fresh = append(fresh, n.Channel)
		}
	}
	if held {
		if err := batch.Release(ctx); err != nil {
			// Every item is in; those not released go when the hold ends.
			s.log.Error("a batch is enqueued but not all of it released: the rest goes when its hold ends",
				"hold", tasks.BatchHold, "err", err)
		}
	}
	for _, ch := range fresh {
		s.metrics.enqueued.WithLabelValues(string(ch)).Inc()
	}
	return out, nil
}

// toEnqueue fills out (queued, or sent for a keyed retry whose first
// attempt was sent already: the id is not in the queue any more, but the
// workers' done record holds it) and returns the items still to enqueue,
// the index in ns of each, and the ids sent already.
func (s *Server) toEnqueue(ctx context.Context, ns []tasks.Notification, keyed bool, out []Accepted) ([]tasks.Item, []int, []string, error) {
	policy, layout := s.policy(), s.cfg.Layout()
	var items []tasks.Item
	var at []int
	var sent []string
	recs := make([]*throttle.Record, len(ns))
	if keyed && len(ns) > 0 {
		// One tenant per request: its records in one round trip.
		ids := make([]string, len(ns))
		for i, n := range ns {
			ids[i] = n.ID
		}
		var err error
		if recs, err = s.lim.Records(ctx, ns[0].Tenant, ids); err != nil {
			return nil, nil, sent, err
		}
	}
	for i, n := range ns {
		out[i] = Accepted{ID: n.ID, Tenant: n.Tenant, State: StateQueued}
		if rec := recs[i]; rec != nil && rec.Kind == throttle.RecordDone {
			out[i].State = StateSent
			sent = append(sent, n.ID)
			continue
		}
		items, at = append(items, tasks.Item{N: n, Opts: []asynq.Option{asynq.Queue(policy.Queue(layout, n))}}), append(at, i)
	}
	return items, at, sent, nil
}

// uncount takes ids out of tenant's queued work again.
func (s *Server) uncount(ctx context.Context, tenant string, ids []string) {
	if len(ids) == 0 {
		return
	}
	if _, err := s.deps.Queued.Release(context.WithoutCancel(ctx), tenant, ids...); err != nil {
		s.log.Warn("queued count not corrected; it lapses after TENANT_QUEUED_TTL", "err", err)
	}
}

// enqueueAll enqueues a keyed batch that fits one script into its rooms
// all or none (tasks.Producer.EnqueueAll), with no hold to release: were
// the answer lost, a retry with the Idempotency-Key finds its items
// enqueued and adopts them. (Without a key a retry would enqueue them
// again: such a batch is held.) false, nil: nothing enqueued; the batch
// goes held.
func (s *Server) enqueueAll(ctx context.Context, items []tasks.Item) (bool, error) {
	for _, it := range items {
		// Each item's one option is its queue (toEnqueue): a batch over two
		// goes held at once, not sealed first by EnqueueAll to find out.
		if it.Opts[0].Value() != items[0].Opts[0].Value() {
			return false, nil
		}
	}
	_, ok, err := s.producer.EnqueueAll(ctx, items)
	if ok {
		for _, it := range items {
			s.metrics.enqueued.WithLabelValues(string(it.N.Channel)).Inc()
		}
	}
	return ok, err
}

// enqueueItems enqueues a request's items: held in batch (one script per
// queue; Release makes them due), or the one of a single notification
// straight into its tenant's room.
func (s *Server) enqueueItems(ctx context.Context, batch *tasks.Batch, items []tasks.Item, held bool) ([]tasks.Result, error) {
	if len(items) == 0 {
		return nil, nil
	}
	if held {
		return batch.AddMany(ctx, items)
	}
	return s.producer.EnqueueMany(ctx, items)
}

// abort deletes what a failed batch enqueued; what Redis did not let it
// delete is tried again in the background until shortly before the hold
// ends (after that the items would be sent).
func (s *Server) abort(b *tasks.Batch) {
	left, err := b.Abort()
	if err == nil {
		return
	}
	s.log.Warn("a failed batch left held tasks; deleting them in the background", "tasks", len(left), "err", err)
	go func() {
		deadline := time.Now().Add(tasks.BatchHold - 30*time.Second)
		for len(left) > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Second)
			left, err = tasks.AbortTasks(s.insp, left)
		}
		if len(left) > 0 {
			s.log.Error("held tasks of a failed batch could not be deleted: they will be sent when their hold ends", "tasks", len(left), "err", err)
		}
	}()
}

// answerRetry answers a request whose Idempotency-Key has a record: the
// stored response, or 409 while the first request is in flight, or 422
// when the request differs from the one the key was first used for.
func (s *Server) answerRetry(w http.ResponseWriter, r *http.Request, rec *idemRecord, tenant, key string) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	if rec.Fingerprint != "" && rec.Fingerprint != fingerprint(r, body) {
		writeProblem(w, http.StatusUnprocessableEntity, "idempotency-mismatch",
			"this Idempotency-Key was used for a request with another body; use a new key for a new request")
		return
	}
	if rec.State != stateDone {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, "idempotency-in-flight",
			"a request with this Idempotency-Key is still being processed; retry it when that one has been answered")
		return
	}
	s.metrics.replays.Inc()
	w.Header().Set(HeaderReplayed, "true")
	if rec.Body == nil {
		v, loc, ok := rec.replay(tenant, key)
		if !ok {
			s.log.Error("an idempotency record does not rebuild its answer", "status", rec.Status, "n", rec.Count)
			writeProblem(w, http.StatusInternalServerError, "internal", "the kept answer of this Idempotency-Key does not read; the notifications' ids are those of the key (GET them)")
			return
		}
		if loc != "" {
			w.Header().Set("Location", loc)
		}
		writeJSON(w, rec.Status, v)
		return
	}
	if rec.Location != "" {
		w.Header().Set("Location", rec.Location)
	}
	w.Header().Set("Content-Type", rec.ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

// readBody reads the whole body, up to Config.MaxBodyBytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, "too-large", fmt.Sprintf("the body is over %d bytes (SLUICE_API_MAX_BODY_BYTES); split the batch", s.cfg.MaxBodyBytes))
		return nil, false
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "the body could not be read: "+err.Error())
		return nil, false
	}
	return body, true
}

// tenantOf is the tenant a request acts for: the token's, or for the admin
// the one named by ?tenant=.
func (s *Server) tenantOf(w http.ResponseWriter, r *http.Request, id identity) (string, bool) {
	named := r.URL.Query().Get("tenant")
	if id.Admin {
		if named == "" {
			// Allowed by the schema, which cannot tie the parameter to the token.
			writeProblem(w, http.StatusUnprocessableEntity, "tenant-required", "an admin token must name the tenant it acts for: ?tenant=ID",
				InvalidParam{Name: "tenant", Reason: "is required with the admin token"})
			return "", false
		}
		if err := tasks.CheckTenant(named); err != nil {
			writeProblem(w, http.StatusBadRequest, "invalid-request", "an admin token must name the tenant: ?tenant=ID",
				InvalidParam{Name: "tenant", Reason: fieldReason(err)})
			return "", false
		}
		return named, true
	}
	if named != "" && named != id.Tenant {
		writeProblem(w, http.StatusForbidden, "forbidden", "a tenant token acts for its own tenant only", InvalidParam{Name: "tenant", Reason: "is not this token's tenant"})
		return "", false
	}
	return id.Tenant, true
}

// keeper passes a 202 through and hands it to onAccepted (to keep it for replay).
type keeper struct {
	http.ResponseWriter
	status     int
	body       []byte
	onAccepted func(status int, h http.Header, body []byte)
}

func (k *keeper) WriteHeader(code int) {
	if k.status == 0 {
		k.status = code
	}
	k.ResponseWriter.WriteHeader(code)
}

func (k *keeper) Write(b []byte) (int, error) {
	if k.status == 0 {
		k.WriteHeader(http.StatusOK)
	}
	if k.status == http.StatusAccepted && k.onAccepted != nil {
		k.body = append(k.body, b...)
		// Kept before the client sees it: a retry racing the answer finds it.
		k.onAccepted(k.status, k.Header(), k.body)
		k.onAccepted = nil
	}
	return k.ResponseWriter.Write(b)
}

// splitBatch tells a single notification from a batch.
func splitBatch(body []byte) ([]json.RawMessage, bool, *Problem) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		why := "is not a JSON object"
		if err != nil {
			why += ": " + err.Error()
		}
		return nil, false, &Problem{Status: http.StatusBadRequest, Detail: "the body " + why + "; send a notification or {\"notifications\": [...]}"}
	}
	raw, isBatch := top["notifications"]
	if !isBatch {
		return []json.RawMessage{body}, false, nil
	}
	var params []InvalidParam
	for k := range top {
		if k != "notifications" {
			params = append(params, bodyParam(k, "a batch holds only \"notifications\"", "/"+pointerToken(k)))
		}
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		params = append(params, bodyParam("notifications", "must be an array of notifications", "/notifications"))
	} else if len(items) == 0 || len(items) > MaxBatch {
		params = append(params, bodyParam("notifications", fmt.Sprintf("holds %d notifications; a batch holds 1 to %d", len(items), MaxBatch), "/notifications"))
	}
	if len(params) > 0 {
		slices.SortFunc(params, func(a, b InvalidParam) int { return cmpString(a.Name, b.Name) })
		return nil, true, &Problem{Status: http.StatusBadRequest, Detail: "the batch is malformed; nothing was enqueued", InvalidParams: params}
	}
	return items, true, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// QueueFullRetry is the Retry-After of a 429 queue-full: the caps free as
// the tenant's notifications are sent, which no one can foretell exactly.
const QueueFullRetry = 30 * time.Second
