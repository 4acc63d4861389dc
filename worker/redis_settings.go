package worker

import (
	"github.com/sluicehq/sluice/internal/redisguard"
	"github.com/sluicehq/sluice/plans"
)

// checkListpack warns about rules whose limit is above Redis's
// zset-max-listpack-entries (max; -1 where CONFIG GET is refused: nothing
// to check): their full windows are skiplists, about 5× the memory per
// entry (docs/redis.md, "Memory and capacity").
func (w *Worker) checkListpack(max int) {
	if max < 0 {
		w.core.log.Debug("cannot read zset-max-listpack-entries; not checking rule limits against it")
		return
	}
	for _, e := range w.core.currentPolicy().Entries() {
		if e.Kind == plans.KindRate && e.Rule.Limit > max {
			w.core.log.Warn("a rule's limit is above Redis's zset-max-listpack-entries: its full windows are skiplists (~5x the memory per entry); raise the setting to at least the limit",
				"rule", e.String(), "limit", e.Rule.Limit, "zset_max_listpack_entries", max)
		}
	}
}

// watchRedis keeps the guard that watches Redis's settings (for /readyz)
// and warns about rule limits above zset-max-listpack-entries.
func (w *Worker) watchRedis(g *redisguard.Guard, r redisguard.Report) {
	w.redisGuard.Store(g)
	w.checkListpack(r.ListpackEntries())
}
