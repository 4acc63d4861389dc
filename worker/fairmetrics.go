package worker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/completer"
	"github.com/sluicehq/sluice/internal/fairq"
)

// registerFairMetrics exports what the fair dispatch did (internal/fairq).
func registerFairMetrics(reg prometheus.Registerer, d *fairq.Dispatcher) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_fair_refills_total",
			Help: "Refills of a shard's pending list from its tenants' waiting rooms, each sent with a dequeue in one round trip."},
			func() float64 { return float64(d.Stats().Refills) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_fair_dispatched_total",
			Help: "Notifications moved from their tenants' waiting rooms into their queue's pending list (start-time fair queuing between the tenants waiting)."},
			func() float64 { return float64(d.Stats().Moved) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_fair_redirects_total",
			Help: "Dequeues answered from another shard of the lane than Asynq asked: the shards are drawn weighted by the tenants waiting in each."},
			func() float64 { return float64(d.Stats().Redirects) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_dequeue_batched_total",
			Help: "Tasks taken by dequeues that took several in one round trip (SLUICE_DEQUEUE_BATCH)."},
			func() float64 { return float64(d.Stats().Taken) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_dequeue_ahead_total",
			Help: "Dequeues answered without a round trip, with a task an earlier dequeue took ahead."},
			func() float64 { return float64(d.Stats().Ahead) }))
}

// registerCompleterMetrics exports the batched completions (internal/completer).
func registerCompleterMetrics(reg prometheus.Registerer, c *completer.Completer) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_completions_total",
			Help: "Tasks Asynq completed through the worker's batched completions."},
			func() float64 { return float64(c.Stats().Completed) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_completion_batches_total",
			Help: "Round trips the batched completions took: completions over batches is the mean batch."},
			func() float64 { return float64(c.Stats().Batches) }))
}
