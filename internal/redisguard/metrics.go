package redisguard

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the guard's Prometheus series, one per node (label node:
// host:port as the client dials it).
type metrics struct {
	evicted *prometheus.CounterVec
	used    *prometheus.GaugeVec
	max     *prometheus.GaugeVec
	ratio   *prometheus.GaugeVec
	info    *prometheus.GaugeVec
	safe    *prometheus.GaugeVec
	labels  map[string][]string // the info series set per node
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_redis_evicted_keys_total",
			Help: "Keys Redis evicted (rise of INFO evicted_keys) since this process started watching, by node. Any rise may have taken quota windows, done records, idempotency keys or queued tasks.",
		}, []string{"node"}),
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_redis_memory_used_bytes",
			Help: "Redis used_memory by node, as of the latest check.",
		}, []string{"node"}),
		max: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_redis_memory_max_bytes",
			Help: "Redis maxmemory by node (0: no limit).",
		}, []string{"node"}),
		ratio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_redis_memory_used_ratio",
			Help: "Redis used_memory / maxmemory by node (only nodes with a limit): at 1 a noeviction node refuses writes.",
		}, []string{"node"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_redis_node_info",
			Help: "1 per Redis node, with its role and the settings the guarantees rest on (unknown where the node would not tell).",
		}, []string{"node", "role", "maxmemory_policy", "appendonly", "appendfsync"}),
		safe: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_redis_crash_safe",
			Help: "1 where a write the node acknowledged survives its crash (appendonly yes, appendfsync always), else 0.",
		}, []string{"node"}),
		labels: map[string][]string{},
	}
	reg.MustRegister(m.evicted, m.used, m.max, m.ratio, m.info, m.safe)
	return m
}

// set records a node's latest read; an info series whose labels changed
// replaces the old one.
func (m *metrics) set(n Node) {
	m.evicted.WithLabelValues(n.Addr) // present from the start, at 0
	if n.UsedMemory >= 0 {
		m.used.WithLabelValues(n.Addr).Set(float64(n.UsedMemory))
	}
	if n.Maxmemory >= 0 {
		m.max.WithLabelValues(n.Addr).Set(float64(n.Maxmemory))
	}
	if n.Maxmemory > 0 && n.UsedMemory >= 0 {
		m.ratio.WithLabelValues(n.Addr).Set(n.MemoryRatio())
	} else {
		m.ratio.DeleteLabelValues(n.Addr)
	}
	labels := []string{n.Addr, n.Role, n.MaxmemoryPolicy, n.AppendOnly, n.Appendfsync}
	if old, ok := m.labels[n.Addr]; ok && !slices.Equal(old, labels) {
		m.info.DeleteLabelValues(old...)
	}
	m.labels[n.Addr] = labels
	m.info.WithLabelValues(labels...).Set(1)
	safe := 0.0
	if n.CrashSafe() {
		safe = 1
	}
	m.safe.WithLabelValues(n.Addr).Set(safe)
}

// drop deletes the series of a node the client no longer lists.
func (m *metrics) drop(addr string) {
	for _, v := range []interface{ DeleteLabelValues(...string) bool }{m.evicted, m.used, m.max, m.ratio, m.safe} {
		v.DeleteLabelValues(addr)
	}
	if old, ok := m.labels[addr]; ok {
		m.info.DeleteLabelValues(old...)
		delete(m.labels, addr)
	}
}
