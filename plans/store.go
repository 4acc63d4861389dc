package plans

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
)

// ErrNoPlan reports a tenant without a plan of its own.
var ErrNoPlan = errors.New("no plan")

// The store's keys share the {plans} hash tag: one Redis Cluster slot, so a
// change is one transaction.
const (
	keyPlans   = keyspace.PlansTenants // hash: tenant -> Plan (JSON)
	keyVersion = keyspace.PlansVersion // counter of changes
	keyLog     = keyspace.PlansLog     // list of Change (JSON), newest first, capped
	channel    = keyspace.PlansChanged // pub/sub: a change's version
	logLength  = 1000
)

// Plan is a tenant's own rules: entries of the rule grammar that apply to
// that tenant only (no TENANT/ prefixes), replacing the deployment's
// entries with the same target. Tenants without a plan get the defaults.
type Plan struct {
	Tenant    string    `json:"tenant"`
	Rules     string    `json:"rules"`
	Version   int64     `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
	By        string    `json:"by"`
}

// Change is one entry of the store's log.
type Change struct {
	Version int64     `json:"version"`
	Tenant  string    `json:"tenant"`
	Action  string    `json:"action"` // set or delete
	Rules   string    `json:"rules,omitempty"`
	By      string    `json:"by"`
	At      time.Time `json:"at"`
}

// Store keeps tenant plans in Redis. Every change bumps one version
// counter, is logged, and is announced on pub/sub.
type Store struct {
	rdb      redis.UniversalClient
	defaults Policy
}

// NewStore returns a store whose tenants without a plan get defaults.
func NewStore(rdb redis.UniversalClient, defaults Policy) *Store {
	return &Store{rdb: rdb, defaults: defaults}
}

// Check validates a plan's rules for tenant against the defaults, without storing them.
func (s *Store) Check(tenant, rules string) (Policy, error) {
	if err := tasks.CheckTenant(tenant); err != nil {
		return Policy{}, err
	}
	p, err := Parse(rules)
	if err != nil {
		return Policy{}, err
	}
	return s.defaults.With(tenant, p)
}

// Set stores (or replaces) tenant's plan, recording who made the change.
func (s *Store) Set(ctx context.Context, tenant, rules, by string) (Plan, error) {
	p, err := Parse(rules)
	if err != nil {
		return Plan{}, err
	}
	if _, err := s.Check(tenant, rules); err != nil {
		return Plan{}, err
	}
	// Store the canonical form: what was parsed, printed back.
	canon := strings.ReplaceAll(p.String(), tenant+"/", "")
	plan := Plan{Tenant: tenant, Rules: canon, UpdatedAt: time.Now().UTC().Truncate(time.Millisecond), By: by}
	return plan, s.change(ctx, &plan, "set")
}

// Delete removes tenant's plan: the defaults apply to it again.
func (s *Store) Delete(ctx context.Context, tenant, by string) (Plan, error) {
	old, err := s.Get(ctx, tenant)
	if err != nil {
		return Plan{}, err
	}
	plan := Plan{Tenant: tenant, Rules: old.Rules, UpdatedAt: time.Now().UTC().Truncate(time.Millisecond), By: by}
	return plan, s.change(ctx, &plan, "delete")
}

func (s *Store) change(ctx context.Context, plan *Plan, action string) error {
	// Optimistic transaction on the version: the version, the plan and the
	// log move together, or the change is tried again on the new version.
	for try := 0; try < 16; try++ {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			v, err := tx.Get(ctx, keyVersion).Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			plan.Version = v + 1
			body, _ := json.Marshal(plan)
			entry, _ := json.Marshal(Change{Version: plan.Version, Tenant: plan.Tenant, Action: action, Rules: plan.Rules, By: plan.By, At: plan.UpdatedAt})
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, keyVersion, plan.Version, 0)
				if action == "delete" {
					p.HDel(ctx, keyPlans, plan.Tenant)
				} else {
					p.HSet(ctx, keyPlans, plan.Tenant, body)
				}
				p.LPush(ctx, keyLog, entry)
				p.LTrim(ctx, keyLog, 0, logLength-1)
				return nil
			})
			return err
		}, keyVersion)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		if err != nil {
			return fmt.Errorf("plans: %w", err)
		}
		// Watchers also poll the version, so a lost message only delays them.
		_ = s.rdb.Publish(ctx, channel, strconv.FormatInt(plan.Version, 10)).Err()
		return nil
	}
	return fmt.Errorf("plans: too many concurrent changes; try again")
}

// Get returns tenant's plan, or ErrNoPlan.
func (s *Store) Get(ctx context.Context, tenant string) (Plan, error) {
	raw, err := s.rdb.HGet(ctx, keyPlans, tenant).Result()
	if errors.Is(err, redis.Nil) {
		return Plan{}, fmt.Errorf("%w for tenant %s", ErrNoPlan, tenant)
	}
	if err != nil {
		return Plan{}, fmt.Errorf("plans: %w", err)
	}
	var p Plan
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		return Plan{}, fmt.Errorf("plans: tenant %s: stored plan does not read: %w", tenant, err)
	}
	return p, nil
}

// Snapshot is every plan at one version, merged with the defaults.
type Snapshot struct {
	Version int64
	Plans   []Plan
	Policy  Policy
}

// Load reads every plan and the version in one transaction and merges
// them into the defaults. A stored plan that no longer validates (say the
// defaults changed) is left out and reported in the error, with the rest
// of the snapshot still returned.
func (s *Store) Load(ctx context.Context) (Snapshot, error) {
	var all *redis.MapStringStringCmd
	var ver *redis.StringCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, keyPlans)
		ver = p.Get(ctx, keyVersion)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Snapshot{}, fmt.Errorf("plans: %w", err)
	}
	snap := Snapshot{Policy: s.defaults}
	snap.Version, _ = strconv.ParseInt(ver.Val(), 10, 64)
	tenants := make([]string, 0, len(all.Val()))
	for t := range all.Val() {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	var errs []error
	for _, t := range tenants {
		var p Plan
		if err := json.Unmarshal([]byte(all.Val()[t]), &p); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", t, err))
			continue
		}
		rules, err := Parse(p.Rules)
		if err == nil {
			var merged Policy
			if merged, err = snap.Policy.With(t, rules); err == nil {
				snap.Policy = merged
				snap.Plans = append(snap.Plans, p)
				continue
			}
		}
		errs = append(errs, fmt.Errorf("tenant %s (version %d): %w", t, p.Version, err))
	}
	return snap, errors.Join(errs...)
}

// History returns the latest n changes, newest first.
func (s *Store) History(ctx context.Context, n int) ([]Change, error) {
	raw, err := s.rdb.LRange(ctx, keyLog, 0, int64(n)-1).Result()
	if err != nil {
		return nil, fmt.Errorf("plans: %w", err)
	}
	out := make([]Change, 0, len(raw))
	for _, r := range raw {
		var c Change
		if json.Unmarshal([]byte(r), &c) == nil {
			out = append(out, c)
		}
	}
	return out, nil
}

// Watcher keeps the current snapshot of a store: it reloads on every
// change announced on pub/sub, and checks the version every interval so a
// missed message is caught. Each check reads Current once: one consistent
// plan per check.
type Watcher struct {
	store    *Store
	interval time.Duration
	log      *slog.Logger
	cur      atomic.Pointer[Snapshot]
	onChange func(old, new Snapshot, changes []Change)
	done     chan struct{}
}

// Watch loads the plans and keeps them current until ctx ends. onChange,
// if set, is called after each reload that changed the version, with the
// changes in between (oldest first).
func (s *Store) Watch(ctx context.Context, interval time.Duration, log *slog.Logger, onChange func(old, new Snapshot, changes []Change)) (*Watcher, error) {
	w := &Watcher{store: s, interval: interval, log: log, onChange: onChange, done: make(chan struct{})}
	// Subscribe before the first load, so no change falls between the two.
	sub := s.rdb.Subscribe(ctx, channel)
	if _, err := sub.Receive(ctx); err != nil {
		sub.Close()
		return nil, fmt.Errorf("plans: subscribe: %w", err)
	}
	snap, err := s.Load(ctx)
	if err != nil {
		log.Error("a tenant plan does not apply; that tenant gets the defaults", "err", err)
		if snap.Version == 0 && snap.Plans == nil {
			sub.Close()
			return nil, err
		}
	}
	w.cur.Store(&snap)
	go w.run(ctx, sub)
	return w, nil
}

// Current returns the snapshot in force.
func (w *Watcher) Current() Snapshot { return *w.cur.Load() }

// Done is closed when the watcher stops.
func (w *Watcher) Done() <-chan struct{} { return w.done }

func (w *Watcher) run(ctx context.Context, sub *redis.PubSub) {
	defer close(w.done)
	defer sub.Close()
	msgs := sub.Channel()
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-msgs:
		case <-tick.C:
		}
		w.refresh(ctx)
	}
}

// refresh reloads when the version moved.
func (w *Watcher) refresh(ctx context.Context) {
	old := w.Current()
	v, err := w.store.rdb.Get(ctx, keyVersion).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		if ctx.Err() == nil {
			w.log.Warn("cannot read the plans' version; keeping the plans in force", "version", old.Version, "err", err)
		}
		return
	}
	if v == old.Version {
		return
	}
	snap, err := w.store.Load(ctx)
	if err != nil {
		w.log.Error("a tenant plan does not apply; that tenant gets the defaults", "err", err)
		if snap.Version == 0 && snap.Plans == nil {
			return
		}
	}
	w.cur.Store(&snap)
	var changes []Change
	if hist, err := w.store.History(ctx, int(min(snap.Version-old.Version, logLength))); err == nil {
		for i := len(hist) - 1; i >= 0; i-- {
			if hist[i].Version > old.Version && hist[i].Version <= snap.Version {
				changes = append(changes, hist[i])
			}
		}
	}
	if w.onChange != nil {
		w.onChange(old, snap, changes)
	}
}

// Live is the rules in force: the defaults, then — once Follow runs — the
// defaults with every tenant plan of the latest version. Workers and the
// API read it once per check.
type Live struct {
	defaults Policy
	w        atomic.Pointer[Watcher]
}

// NewLive returns rules in force that are the defaults until Follow.
func NewLive(defaults Policy) *Live { return &Live{defaults: defaults} }

// Defaults are the deployment's rules (SLUICE_RULES).
func (l *Live) Defaults() Policy { return l.defaults }

// Current is the snapshot in force; before Follow, the defaults at version 0.
func (l *Live) Current() Snapshot {
	if w := l.w.Load(); w != nil {
		return w.Current()
	}
	return Snapshot{Policy: l.defaults}
}

// Policy is Current().Policy.
func (l *Live) Policy() Policy { return l.Current().Policy }

// Following reports whether Follow started.
func (l *Live) Following() bool { return l.w.Load() != nil }

// Done is closed when the plans stop being followed (ctx of Follow ended);
// nil before Follow.
func (l *Live) Done() <-chan struct{} {
	if w := l.w.Load(); w != nil {
		return w.Done()
	}
	return nil
}

// Follow loads the tenant plans from rdb and keeps them current until ctx
// ends, checking the version every interval besides the pub/sub message of
// each change, and logging each change applied. onChange (optional) runs
// after each, with the new version.
func (l *Live) Follow(ctx context.Context, rdb redis.UniversalClient, interval time.Duration, log *slog.Logger, onChange func(version int64)) error {
	w, err := NewStore(rdb, l.defaults).Watch(ctx, interval, log, func(old, cur Snapshot, changes []Change) {
		for _, c := range changes {
			log.Info("tenant plan changed; applied", "tenant", c.Tenant, "action", c.Action, "version", c.Version, "by", c.By, "at", c.At, "rules", c.Rules)
		}
		log.Info("tenant plans in force", "version", cur.Version, "previous", old.Version, "tenants_with_plans", len(cur.Plans))
		if onChange != nil {
			onChange(cur.Version)
		}
	})
	if err != nil {
		return fmt.Errorf("tenant plans: %w", err)
	}
	l.w.Store(w)
	snap := w.Current()
	log.Info("tenant plans in force", "version", snap.Version, "tenants_with_plans", len(snap.Plans))
	return nil
}
