package tasks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
)

// Defaults of NewTask and Enqueue; each can be overridden with an asynq.Option.
const (
	// DefaultQueue is the base name of the default Layout (and the single
	// queue of releases before lanes, still served).
	DefaultQueue    = "notifications"
	DefaultMaxRetry = 8
	DefaultTimeout  = 30 * time.Second
	// DefaultRetention is how long Asynq keeps a completed task: not at all.
	// The worker keeps a small record per sent notification instead (no
	// payload, no PII), which is what stops a re-send.
	DefaultRetention  = 0
	HeaderRetryBudget = "sluice-retry-budget"
)

// ErrDuplicate reports a notification id that is already enqueued (waiting,
// scheduled, retrying or archived).
var ErrDuplicate = errors.New("duplicate notification id")

// NewTask validates n and returns its Asynq task, with the task id set to
// the notification id (so a second enqueue of the same id is refused while
// the first waits). With keys the payload is sealed (see Keyring); with nil
// keys it is plain JSON, which workers accept only when configured to.
//
// Retry budget: Sluice reschedules throttled tasks without spending their
// retries, and Asynq archives any task whose retries are used up even when
// the error is not a failure. So NewTask stores the real budget (MaxRetry,
// DefaultMaxRetry unless given) in the task header HeaderRetryBudget and
// gives Asynq one more; the worker archives on real failures by that header.
//
// Queue: the task goes to its tenant's waiting room (Room: Asynq's group
// of the tenant) in its lane's shard of DefaultLayout, the lane by
// DefaultLane (the category's convention); asynq.Queue overrides it — a
// producer with another layout, or with the rules (plans.Policy.Queue),
// passes its route that way. The workers dispatch each lane's rooms fairly
// between tenants; a worker moves a task whose queue is not the route
// under the rules in force, at its first check.
//
// NewTask carries no trace context; NewTaskContext does.
func NewTask(n Notification, keys *Keyring, opts ...asynq.Option) (*asynq.Task, error) {
	return NewTaskContext(context.Background(), n, keys, opts...)
}

// NewTaskContext is NewTask with the span context of ctx in the task's
// headers (see InjectTrace): the worker's spans for the task join the
// caller's trace.
func NewTaskContext(ctx context.Context, n Notification, keys *Keyring, opts ...asynq.Option) (*asynq.Task, error) {
	p, err := prepare(ctx, n, keys, opts)
	if err != nil {
		return nil, err
	}
	// The tenant's group is its waiting room (Room): the workers dispatch
	// each lane's rooms fairly. A task enqueued scheduled (ProcessAt,
	// ProcessIn) goes straight to its queue when due instead.
	return asynq.NewTaskWithHeaders(p.typ, p.payload, p.headers, append([]asynq.Option{asynq.Group(p.n.Tenant)}, p.opts...)...), nil
}

// prepared is a notification made ready to enqueue: its task's type,
// sealed payload, headers and options (the queue, the retry budget plus
// one, the timeout, the retention and the id last).
type prepared struct {
	n       Notification
	typ     string
	payload []byte
	headers map[string]string
	opts    []asynq.Option
}

func prepare(ctx context.Context, n Notification, keys *Keyring, opts []asynq.Option) (prepared, error) {
	n = n.Normalized()
	if n.ID == "" {
		n.ID = NewID()
	}
	if n.EnqueuedAt.IsZero() {
		n.EnqueuedAt = time.Now().UTC().Truncate(time.Millisecond)
	}
	if !n.ExpiresAt.IsZero() && !n.ExpiresAt.After(time.Now()) {
		return prepared{}, invalid("expires_at", "is already past")
	}
	typ, err := n.Channel.TaskType()
	if err != nil {
		return prepared{}, err
	}
	payload, err := n.Encode()
	if err != nil {
		return prepared{}, err
	}
	if keys != nil {
		payload = keys.Seal(n.ID, typ, payload)
	}
	budget := DefaultMaxRetry
	all := []asynq.Option{asynq.Queue(DefaultLayout.Route(n.Tenant, DefaultLane(n.Category), nil)), asynq.Timeout(DefaultTimeout), asynq.Retention(DefaultRetention)}
	for _, o := range opts {
		if o.Type() == asynq.MaxRetryOpt {
			budget = o.Value().(int)
			continue
		}
		all = append(all, o)
	}
	if budget < 0 {
		budget = 0
	}
	all = append(all, asynq.MaxRetry(budget+1), asynq.TaskID(n.ID))
	headers := map[string]string{HeaderRetryBudget: strconv.Itoa(budget)}
	InjectTrace(ctx, headers)
	return prepared{n: n, typ: typ, payload: payload, headers: headers, opts: all}, nil
}

// Open returns the notification of a task's payload: sealed payloads are
// opened with keys (bound to the task's id and type); plain JSON is accepted
// only when allowPlain. Every error wraps ErrInvalid, ErrSealed or
// ErrNotSealed and says why.
func Open(keys *Keyring, taskID, taskType string, payload []byte, allowPlain bool) (Notification, error) {
	if IsSealed(payload) {
		if keys == nil {
			return Notification{}, fmt.Errorf("%w: no SLUICE_PAYLOAD_KEYS to open it with", ErrSealed)
		}
		plain, err := keys.Open(taskID, taskType, payload)
		if err != nil {
			return Notification{}, err
		}
		payload = plain
	} else if !allowPlain {
		return Notification{}, fmt.Errorf("%w: plaintext payloads are refused (seal them with SLUICE_PAYLOAD_KEYS, or set SLUICE_PAYLOAD_PLAINTEXT=accept)", ErrNotSealed)
	}
	return Decode(payload)
}

// Reseal seals a task's payload again for another task id (a rescheduled copy).
func Reseal(keys *Keyring, n Notification, taskID, taskType string) ([]byte, error) {
	payload, err := n.Encode()
	if err != nil {
		return nil, err
	}
	if keys == nil {
		return payload, nil
	}
	return keys.Seal(taskID, taskType, payload), nil
}

// RetryBudget returns the real retry budget of a task: the header set by
// NewTask, or, for a task built elsewhere, maxRetry as Asynq knows it.
func RetryBudget(t *asynq.Task, maxRetry int) int {
	if v, ok := t.Headers()[HeaderRetryBudget]; ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return n
		}
	}
	return maxRetry
}

// Enqueue validates, seals (with non-nil keys) and enqueues n. It returns
// Asynq's task info; an id still enqueued gives ErrDuplicate. An id already
// sent is accepted here and skipped by the worker (it remembers sent ids for
// SLUICE_DEDUPE_TTL). The span context of ctx, if any, travels with the
// task (W3C traceparent header): the worker's spans join the caller's trace.
func Enqueue(ctx context.Context, c *asynq.Client, keys *Keyring, n Notification, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	if n.ID == "" {
		n.ID = NewID()
	}
	t, err := NewTaskContext(ctx, n, keys, opts...)
	if err != nil {
		return nil, err
	}
	info, err := c.EnqueueContext(ctx, t)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil, fmt.Errorf("%w: %s: %w", ErrDuplicate, n.ID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: enqueue %s: %w", n.ID, err)
	}
	return info, nil
}
