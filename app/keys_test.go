package app_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// permanentRows are the rows of keyspace's key table (which
// docs/architecture.md shows) whose TTL is **none**: a suppression that
// never lapses, API tokens, tenant plans, webhook credentials, digest
// templates, Sluice's fair dispatch beside Asynq's keys and Asynq's own.
// Only their keys may live without a TTL; every other key carries one
// (the design's invariant 4), so idle subjects vanish.
var permanentRows = func() []keyspace.Row {
	var out []keyspace.Row
	for _, r := range keyspace.Table() {
		if r.Permanent() {
			out = append(out, r)
		}
	}
	return out
}()

// permanentKeys are the key patterns of permanentRows, every
// <placeholder> written as '*', sorted: what TestKeysDoc finds on the page.
var permanentKeys = func() []string {
	var out []string
	placeholder := regexp.MustCompile(`<[^>]*>`)
	for _, r := range permanentRows {
		for _, k := range r.Keys {
			out = append(out, placeholder.ReplaceAllString(k, "*"))
		}
	}
	slices.Sort(out)
	return out
}()

// permanent reports whether key may live without a TTL: a permanent row
// covers it.
func permanent(key string) bool {
	return slices.ContainsFunc(permanentRows, func(r keyspace.Row) bool { return r.Matches(key) })
}

// leftByTheRun are keys the run below must leave (one pattern each), so a
// scan that finds nothing without a TTL has looked at what it claims to.
var leftByTheRun = []string{
	"sl1:{acme}:sms:recipient:*",   // a window
	"sl1:{acme}:email:recipient:*", // another channel's
	"sl1:{acme}:n:*",               // a done record
	"sl1:{acme}:n:*:to",            // the recipient note of an SMS
	"sl1:{acme}:n:*:dlv",           // its delivery record
	"sl1:{acme}:consent:sms:*",     // the STOP reply's opt-out
	"sl1:{acme}:ledger:sms:*",      // and its ledger
	"sl1:{acme}:once:reply-stop:sms:*",
	"sl1:{sluice}:migrated::*", // the worker's migration marker
	"sluice:api:{acme}:idem:*",
	"sluice:api:{ntok:*}:*",
	"sl1:{api%2F*}:api:requests:*",
	"sl1:{authfail%2F*}:auth:failures:*",
	"sluice:{api}:token:*",
	"sluice:{plans}:tenants",
	"sluice:{acme}:webhooks",
	"asynq:{notifications.*}:*",
}

// Every key a worker and the API leave in Redis, after sends of both
// channels, a status callback, a STOP reply and its confirmation, a failed
// authentication, an Idempotency-Key, a token, a tenant plan and webhook
// credentials, has a TTL, unless docs/architecture.md lists it as
// permanent: on one node and on a 3-master Cluster.
func TestKeysExpire(t *testing.T) {
	sluicetest.Slow(t)
	t.Run("SingleNode", func(t *testing.T) {
		srv, rdb := redistest.New(t)
		checkKeysExpire(t, map[string]string{"SLUICE_REDIS_URL": srv.URL()}, rdb)
	})
	t.Run("Cluster", func(t *testing.T) {
		cl, cc := redistest.NewCluster(t, 3, 0)
		checkKeysExpire(t, map[string]string{"SLUICE_REDIS_URL": "redis://" + cl.Addrs[0],
			"SLUICE_REDIS_CLUSTER_ADDRS": strings.Join(cl.Addrs, ",")}, cc)
	})
}

func checkKeysExpire(t *testing.T, redisVars map[string]string, rdb redis.UniversalClient) {
	sys := startSystem(t, redisVars, rdb)
	sys.exercise(t)
	sys.stop(t)
	ttls := scanTTLs(t, rdb)
	for _, want := range leftByTheRun {
		if !slices.ContainsFunc(keysOf(ttls), func(k string) bool { return globMatch(want, k) }) {
			t.Errorf("the run left no key like %s: the scan checked less than it claims", want)
		}
	}
	for _, k := range keysOf(ttls) {
		if ttls[k] < 0 && !permanent(k) {
			t.Errorf("key %s has no TTL and is not among the permanent keys of docs/architecture.md", k)
		}
	}
	t.Logf("%d keys scanned", len(ttls))
}

// docs/architecture.md's key table marks as living without a TTL exactly
// the keys the scan allows to.
func TestKeysDoc(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	got := pagePermanentRows(string(raw))
	if want := permanentKeys; !slices.Equal(got, want) {
		t.Errorf("docs/architecture.md's keys without a TTL are\n%q\nthe scan allows\n%q", got, want)
	}
}

// pagePermanentRows are the key patterns of the rows of the page's "## Redis
// keys" table whose last cell starts with **none**: each code span of the
// first cell, with every <placeholder> written as '*'.
func pagePermanentRows(page string) []string {
	var out []string
	in := false
	placeholder := regexp.MustCompile(`<[^>]*>`)
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## Redis keys"
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if !in || !strings.HasPrefix(line, "|") || len(cells) < 2 || !strings.HasPrefix(strings.TrimSpace(cells[len(cells)-1]), "**none**") {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[0], -1) {
			out = append(out, placeholder.ReplaceAllString(m[1], "*"))
		}
	}
	slices.Sort(out)
	return out
}

// globMatch reports whether key matches pattern, '*' matching any run of
// characters ('/' and ':' included).
func globMatch(pattern, key string) bool {
	parts := strings.Split(pattern, "*")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(key)
}

func keysOf(m map[string]time.Duration) []string { return slices.Sorted(maps.Keys(m)) }

// scanTTLs reads every key of every master with its PTTL (-1: none).
func scanTTLs(t *testing.T, rdb redis.UniversalClient) map[string]time.Duration {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	out := map[string]time.Duration{}
	scan := func(ctx context.Context, node *redis.Client) error {
		it := node.Scan(ctx, 0, "*", 1000).Iterator()
		for it.Next(ctx) {
			ttl, err := node.PTTL(ctx, it.Val()).Result()
			if err != nil {
				return err
			}
			if ttl == -2 {
				continue // gone since the scan listed it (emptied, or expired): not a key without TTL
			}
			mu.Lock()
			out[it.Val()] = ttl
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("a %T", rdb)
	}
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return out
}
