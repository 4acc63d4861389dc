package main

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/throttle"
)

// probeLib is a function library of probes: each FCALL makes ten of one
// kind of redis.call (on ten keys it is given), or none. What one call costs
// inside a function, all in, is (the probe's time per FCALL − none's) / 10;
// INFO commandstats also gives each command's own time, so the rest is what
// the call costs around its command (Lua to Redis and back, the call's
// bookkeeping).
const probeLib = `#!lua name=sluice_bench_probes
local function probe(keys, argv)
  local call, op = redis.call, argv[1]
  if op == 'none' then return 0 end
  local v = argv[2]
  for i = 1, 10 do
    local k = keys[i]
    if op == 'read' then call('ZSCORE', k, 'm1')
    elseif op == 'trim' then call('ZREMRANGEBYSCORE', k, '-inf', '(1')
    elseif op == 'count' then call('ZCOUNT', k, '1', v)
    elseif op == 'update' then call('ZADD', k, v, 'm1')
    elseif op == 'expire' then call('PEXPIRE', k, v)
    elseif op == 'newset' then call('ZADD', k, v, 'm1')
    elseif op == 'newkey' then call('SET', k, v, 'PX', '60000')
    end
  end
  return 1
end
redis.register_function('sluice_bench_probe', probe)
`

type probeKind struct {
	op, what, command string
	fresh             bool // the keys are new on every call
}

var probeKinds = []probeKind{
	{"read", "read: ZSCORE of a small set", "zscore", false},
	{"count", "read: ZCOUNT of a small set", "zcount", false},
	{"trim", "write that changes nothing: ZREMRANGEBYSCORE", "zremrangebyscore", false},
	{"update", "write: ZADD of a new score to a member", "zadd", false},
	{"expire", "write: PEXPIRE to a later time", "pexpire", false},
	{"newset", "write that makes a key: ZADD", "zadd", true},
	{"newkey", "write that makes a key: SET … PX", "set", true},
}

// calls: what one redis.call costs inside a Redis function, by kind, and a
// worker-shaped check made alone (no other load), whose Redis time the
// worker rows' -commandstats give in a worker.
func calls(ctx context.Context, rdb *redis.Client) {
	if err := rdb.Do(ctx, "FUNCTION", "LOAD", "REPLACE", probeLib).Err(); err != nil {
		log.Fatalf("calls: loading the probes: %v", err)
	}
	defer rdb.Do(ctx, "FUNCTION", "DELETE", "sluice_bench_probes")
	n := 4000
	if *quick {
		n = 1500
	}
	small := make([]string, 10)
	for i := range small {
		small[i] = "probe:small:" + strconv.Itoa(i)
	}
	prepare := func() {
		rdb.FlushAll(ctx)
		for _, k := range small {
			for j := 1; j <= 10; j++ {
				rdb.ZAdd(ctx, k, redis.Z{Score: float64(1_000_000 + j), Member: "m" + strconv.Itoa(j)})
			}
			rdb.PExpire(ctx, k, time.Hour)
		}
	}
	seq := 0
	// one runs n FCALLs of op and gives the function's and the command's
	// Redis time per FCALL (µs).
	one := func(k probeKind) (float64, float64) {
		prepare()
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			log.Fatal(err)
		}
		keys := small
		for i := 0; i < n; i++ {
			if k.fresh {
				keys = make([]string, 10)
				for j := range keys {
					seq++
					keys[j] = "probe:new:" + strconv.Itoa(seq)
				}
			}
			// A value that grows: each update and expiry is a real change.
			v := strconv.Itoa(2_000_000 + i)
			if err := rdb.FCall(ctx, "sluice_bench_probe", keys, k.op, v).Err(); err != nil {
				log.Fatalf("calls: %s: %v", k.op, err)
			}
		}
		st := commandStats(ctx, rdb)
		return st["fcall"].usec / float64(n), st[k.command].usec / float64(n)
	}
	none := probeKind{op: "none", command: "fcall"}
	base := map[string][]float64{}
	all, own := map[string][]float64{}, map[string][]float64{}
	for r := range *rounds {
		order := probeKinds
		if r%2 == 1 { // A B …, then … B A
			order = make([]probeKind, len(probeKinds))
			for i, k := range probeKinds {
				order[len(probeKinds)-1-i] = k
			}
		}
		b, _ := one(none)
		base["none"] = append(base["none"], b)
		for _, k := range order {
			f, c := one(k)
			all[k.op] = append(all[k.op], (f-b)/10)
			own[k.op] = append(own[k.op], c/10)
		}
	}
	add(row{"calls", "an FCALL of ten keys that returns at once", fmt.Sprintf("%.2f µs", median(base["none"])), "", "(report)", ""})
	for _, k := range probeKinds {
		a, c := median(all[k.op]), median(own[k.op])
		add(row{"calls", "one redis.call, " + k.what, fmt.Sprintf("%.2f µs (command %.2f, around it %.2f)", a, c, a-c), "", "(report)", ""})
	}
	workerCheckAlone(ctx, rdb, n)
	rdb.FlushAll(ctx)
}

// workerCheckAlone: the worker's check of an SMS (two rules, the id's state,
// the legacy suppression key, consent, the recipient note, a provider hold)
// made by one caller with nothing else running: Redis time per FCALL.
func workerCheckAlone(ctx context.Context, rdb *redis.Client, n int) {
	lim := newLimiter(rdb, throttle.Options{})
	defer lim.Close()
	var per []float64
	for range *rounds {
		rdb.FlushAll(ctx)
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			log.Fatal(err)
		}
		var ks keyspace.Space // the limiter's default prefix; the subjects in clear
		for i := 0; i < n; i++ {
			to := fmt.Sprintf("+1416%07d", i)
			id := fmt.Sprintf("probe%d", i)
			opts := throttle.ReserveOptions{
				Policy: throttle.AtLeastOnce, Slack: 100 * time.Millisecond, StateTTL: 24 * time.Hour,
				Nonce: "n" + id, Block: ks.Suppressed("bench", "sms", to), Holds: []string{ks.Subject("bench", "hold:sms", "provider")},
				Consent: &throttle.ConsentCheck{Key: ks.Consent("bench", "sms", to), Category: "default"},
				Note:    &throttle.Note{Key: ks.Record("bench", id, keyspace.RecordRecipient), Value: to, TTL: 24 * time.Hour},
			}
			_, err := lim.Reserve(ctx, "bench", id, opts,
				throttle.Limit{Scope: "sms:recipient", Subject: to, Rule: throttle.Rule{Limit: 100, Window: time.Minute}},
				throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 1_000_000, Window: time.Hour}})
			if err != nil {
				log.Fatalf("calls: the worker-shaped check: %v", err)
			}
		}
		st := commandStats(ctx, rdb)
		if f := st["fcall"]; f.calls > 0 {
			per = append(per, f.usec/f.calls)
		} else if e := st["evalsha"]; e.calls > 0 {
			per = append(per, e.usec/e.calls)
		}
	}
	add(row{"calls", "the worker's check of an SMS, made alone (Redis time per call)", fmt.Sprintf("%.1f µs", median(per)), "", "(report; in a worker: -only worker -commandstats)", ""})
}
