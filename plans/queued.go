package plans

import (
	"fmt"
	"strconv"
)

// Per-tenant caps on queued work (tasks.QueueQuota), beside the
// deployment's SLUICE_TENANT_MAX_QUEUED and SLUICE_TENANT_MAX_QUEUED_BYTES:
//
//	[TENANT/]max-queued=N          notifications queued at once (0: no cap)
//	[TENANT/]max-queued-bytes=N    bytes of queued notifications (0: no cap)
//
// A tenant's plan holds them without TENANT/ (sluice tenant set acme
// 'max-queued=500000'); they apply from the moment the plan does.
const (
	KindMaxQueued      Kind = 100 + iota // [TENANT/]max-queued=N
	KindMaxQueuedBytes                   // [TENANT/]max-queued-bytes=N
)

// MaxQueuedCap bounds a max-queued or max-queued-bytes value.
const MaxQueuedCap = 1 << 50

// parseQueuedCap reads [TENANT/]max-queued=N and max-queued-bytes=N.
func parseQueuedCap(e Entry, t entryText) (Entry, error) {
	e.Kind = KindMaxQueued
	if t.word == "max-queued-bytes" {
		e.Kind = KindMaxQueuedBytes
	}
	n, err := strconv.ParseInt(t.value, 10, 64)
	if !t.hasValue || err != nil || n < 0 || n > MaxQueuedCap {
		return e, fmt.Errorf("%s=%q: want a whole number from 0 (no cap) to %d", t.word, t.value, int64(MaxQueuedCap))
	}
	e.QueuedCap = n
	return e, nil
}

// queuedCapString prints a max-queued entry (without its tenant); ok is
// false for another kind.
func (e Entry) queuedCapString() (string, bool) {
	switch e.Kind {
	case KindMaxQueued:
		return "max-queued=" + strconv.FormatInt(e.QueuedCap, 10), true
	case KindMaxQueuedBytes:
		return "max-queued-bytes=" + strconv.FormatInt(e.QueuedCap, 10), true
	}
	return "", false
}

// QueuedCaps returns tenant's caps on queued work that the rules set: the
// tenant's own entry, else a default entry; set reports each found.
func (p Policy) QueuedCaps(tenant string) (notifications, bytes int64, setN, setB bool) {
	for _, pass := range []string{tenant, ""} {
		for _, e := range p.entries {
			if e.Tenant != pass {
				continue
			}
			switch {
			case e.Kind == KindMaxQueued && !setN:
				notifications, setN = e.QueuedCap, true
			case e.Kind == KindMaxQueuedBytes && !setB:
				bytes, setB = e.QueuedCap, true
			}
		}
	}
	return notifications, bytes, setN, setB
}
