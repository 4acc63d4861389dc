package worker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/tasks"
)

// Metrics are the worker's Prometheus metrics.
type Metrics struct {
	Decisions    *prometheus.CounterVec
	RetryAfter   *prometheus.HistogramVec
	Sends        *prometheus.CounterVec
	SendLatency  *prometheus.HistogramVec
	Rescheduled  *prometheus.CounterVec
	LimiterError prometheus.Counter
	InlineWaits  *prometheus.CounterVec
	Archived     *prometheus.CounterVec
	DoneLost     prometheus.Counter
	Holds        *prometheus.CounterVec
	CapWaits     *prometheus.CounterVec
	LateWakes    *prometheus.CounterVec
	HeldWakes    *prometheus.CounterVec
	// UnknownOutcomes: re-runs after an attempt whose outcome was unknown.
	UnknownOutcomes *prometheus.CounterVec
	// ProviderInFlight: this worker's requests at its providers now.
	ProviderInFlight *prometheus.GaugeVec
	// ProviderUp, ProviderSends, Failovers: each provider's state as this
	// worker last read it, what it sent through each, and the sends that
	// moved on (docs/channels.md, "Failover").
	ProviderUp    *prometheus.GaugeVec
	ProviderSends *prometheus.CounterVec
	Failovers     *prometheus.CounterVec
	// Fallbacks: channel fallbacks armed, triggered, not needed.
	Fallbacks *prometheus.CounterVec
	// Digested: notifications a digest carries instead of a send of their
	// own; DigestItems: items per digest sent.
	Digested    *prometheus.CounterVec
	DigestItems *prometheus.HistogramVec
	Orphans     prometheus.Counter
	// TakenOver: sends held for their slot that this worker took over from
	// a worker presumed dead (taken), or lost to another worker (lost).
	TakenOver  *prometheus.CounterVec
	Moved      *prometheus.CounterVec
	Suppressed *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg.
// Long: one flat list, a metric's name, help and labels each in one place.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_throttle_decisions_total",
			Help: "Limiter decisions by channel, category, what set a later slot (a rule, quiet hours, or empty) and result (admitted, admitted_later, booked, denied, done, unknown, expired, dropped).",
		}, []string{"channel", "category", "rule", "result"}),
		RetryAfter: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_throttle_retry_after_seconds",
			Help:    "Retry-after of denied sends.",
			Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400},
		}, []string{"channel"}),
		Sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_sends_total",
			Help: "Send attempts by channel and result (sent, transient, throttled: a provider's back-pressure, failover: not taken, tried at the next provider, permanent, invalid).",
		}, []string{"channel", "result"}),
		SendLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_send_duration_seconds",
			Help:    "Time a sender took per attempt.",
			Buckets: prometheus.DefBuckets,
		}, []string{"channel"}),
		Rescheduled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rescheduled_total",
			Help: "Tasks handed back to Asynq for a slot ahead (not failures).",
		}, []string{"channel"}),
		LimiterError: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_limiter_errors_total",
			Help: "Quota checks that failed because Redis could not be asked (nothing was sent).",
		}),
	}
	m.InlineWaits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_inline_waits_total",
		Help: "Sends admitted for a slot a little ahead and waited for inside the worker.",
	}, []string{"channel"})
	m.Archived = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_archived_total",
		Help: "Notifications archived without being sent, by channel, category and reason (invalid, unreadable, outcome_unknown, expired, throttled, permanent, retry_budget, suppressed).",
	}, []string{"channel", "category", "reason"})
	m.DoneLost = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_done_record_lost_total",
		Help: "Sends whose completion could not be recorded in Redis before the task's deadline (a re-run counts as a fresh send).",
	})
	m.LateWakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_late_wakes_total",
		Help: "Sends whose in-process wait ended later than half the send slack after their slot: the slot was given back and asked again.",
	}, []string{"channel"})
	reg.MustRegister(m.LateWakes)
	m.HeldWakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_held_wakes_total",
		Help: "Sends admitted before a provider hold began that found it live after their in-process wait: the slot was given back and the send booked after the hold.",
	}, []string{"channel"})
	reg.MustRegister(m.HeldWakes)
	m.UnknownOutcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_unknown_outcomes_total",
		Help: "Re-runs of a notification whose earlier attempt was admitted and never recorded done (a crash mid-send): outcome settled (the provider's status report showed it had the message: not sent again) or resent (no report: sent again, at-least-once).",
	}, []string{"channel", "outcome"})
	reg.MustRegister(m.UnknownOutcomes)
	m.ProviderInFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_provider_inflight",
		Help: "This worker's send requests at each provider now: at most CONCURRENCY standard and bulk plus PRIORITY_CONCURRENCY priority-lane ones per provider.",
	}, []string{"channel", "provider"})
	reg.MustRegister(m.ProviderInFlight)
	m.registerProviders(reg)
	m.Orphans = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_orphans_requeued_total",
		Help: "Tasks Asynq held as active with no worker running them (a killed worker, a dequeue reply lost to a Redis crash) that this worker put back in the queue.",
	})
	reg.MustRegister(m.Orphans)
	m.TakenOver = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_held_takeovers_total",
		Help: "Sends a worker held for their slot whose worker stopped answering: taken (this worker took one over and put it back in the queue, its slot kept) or lost (this worker was presumed dead while it lived and found its send taken over: not sent here).",
	}, []string{"outcome"})
	reg.MustRegister(m.TakenOver)
	m.Suppressed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_recipients_suppressed_total",
		Help: "Recipients a provider's refusal marked undeliverable for their tenant (an SMS error code of SMS_SUPPRESS_CODES, an SMTP hard bounce), by channel and source (provider, bounce).",
	}, []string{"channel", "source"})
	reg.MustRegister(m.Suppressed)
	m.Moved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_moved_total",
		Help: "Tasks found in another lane or shard than the rules in force route them to (a producer without the rules, or a changed plan), moved before any check.",
	}, []string{"channel"})
	reg.MustRegister(m.Moved)
	m.Holds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_provider_holds_total",
		Help: "Throttling answers from a provider (HTTP 429, Twilio 20429/30001, SMTP 421/451/452/454) that held its scope for every worker, by channel, scope (provider, sender) and what they did: began a hold (begun), extended a live one (extended: an answer to a request sent during it), or left it as it was (in_flight: an answer to a request already on its way when it began).",
	}, []string{"channel", "scope", "hold"})
	reg.MustRegister(m.Holds)
	m.CapWaits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_cap_deferrals_total",
		Help: "Sends put back because an in-flight cap (CHANNEL:SCOPE:concurrency=N) stayed full for MAX_INLINE_WAIT, by channel and outcome (deferred).",
	}, []string{"channel", "outcome"})
	reg.MustRegister(m.CapWaits)
	reg.MustRegister(m.Decisions, m.RetryAfter, m.Sends, m.SendLatency, m.Rescheduled, m.LimiterError, m.InlineWaits, m.Archived, m.DoneLost)
	return m
}

// registerGateMetrics exposes what the queue gate saved and whether it is on.
func registerGateMetrics(reg prometheus.Registerer, g *pollgate.Gate) {
	polls := func(result string, f func(pollgate.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_queue_polls_total",
			Help:        "Asynq's polls of the queues (dequeues, forwards of due tasks, housekeeping): sent to Redis, or answered by the worker because Redis reported the key unchanged since it was last read.",
			ConstLabels: prometheus.Labels{"result": result},
		}, func() float64 { return float64(f(g.Stats())) })
	}
	reg.MustRegister(
		polls("sent", func(s pollgate.Stats) uint64 { return s.Passed }),
		polls("answered", func(s pollgate.Stats) uint64 { return s.Skipped }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_queue_gate_active",
			Help: "1 while every Redis master sends this worker its queue keys' invalidations (CLIENT TRACKING) and idle polls are answered locally; 0 while every poll goes to Redis.",
		}, func() float64 {
			if g.Active() {
				return 1
			}
			return 0
		}),
	)
}

// registerProviders creates and registers the failover metrics: each
// provider's state, what it sent, the sends that moved on.
func (m *Metrics) registerProviders(reg prometheus.Registerer) {
	m.ProviderUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_provider_up",
		Help: "1 while a provider is up as this worker last read it; 0 while it is marked down (its breaker open), held (a throttling answer), or probed.",
	}, []string{"channel", "provider"})
	reg.MustRegister(m.ProviderUp)
	m.ProviderSends = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_provider_sends_total",
		Help: "Notifications each provider took (sent) from this worker.",
	}, []string{"channel", "provider"})
	reg.MustRegister(m.ProviderSends)
	m.Failovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_failovers_total",
		Help: "Sends a provider did not take (a refused connection, 503, 429) that moved to the next provider: at once (priority lane) or after the failover grace.",
	}, []string{"channel", "from"})
	reg.MustRegister(m.Failovers)
	m.Fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_fallbacks_total",
		Help: "Channel fallbacks (docs/channels.md, \"Channel fallback\"), by the channel of the notification and result: armed (scheduled before an SMS went), triggered (it will not arrive: the fallback goes now), not_needed (a fallback that found its notification delivered, or not failed).",
	}, []string{"channel", "result"})
	reg.MustRegister(m.Fallbacks)
	m.Digested = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_digested_total",
		Help: "Notifications folded into a digest (plans' digest rule), by channel and result: joined (carried by an open digest instead of a send of their own), sent (carried by a digest that was sent, the carrier's own included), expired (left out: past their expiry when the digest went), spilled (handed back to the queue: their digest ended without a send), failed (carried by a digest archived because the tenant's template passed a limit of its box).",
	}, []string{"channel", "result"})
	m.DigestItems = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_digest_items",
		Help:    "Items per digest sent, the carrier's own included.",
		Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
	}, []string{"channel"})
	reg.MustRegister(m.Digested, m.DigestItems)
}

func channelLabel(taskType string) string {
	switch taskType {
	case tasks.TypeEmail:
		return string(tasks.Email)
	case tasks.TypeSMS:
		return string(tasks.SMS)
	case tasks.TypeWhatsApp:
		return string(tasks.WhatsApp)
	}
	return "unknown"
}
