// Package redisguard reads the Redis settings that Sluice's guarantees rest
// on, from every node a client uses, and watches them while a worker or the
// API runs.
//
// # What it reads
//
// From each node — the single node, or every master and replica of a Redis
// Cluster — its maxmemory-policy, maxmemory, used memory, AOF
// (appendonly, appendfsync), evicted_keys and zset-max-listpack-entries.
// CONFIG GET comes first; where a managed Redis disables CONFIG, INFO
// (memory, persistence, stats, replication) still tells the policy, the
// memory, whether AOF is on and the evictions, and appendfsync and the
// listpack limit are reported as unknown.
//
// # What it refuses, warns about and watches
//
// Start refuses a node whose policy may evict keys (anything but
// noeviction, or a policy that cannot be read) unless Options.AllowEviction
// is set: an evicted key is a quota window that forgot its sends, a done
// record (a re-run sends again), an idempotency key or a queued task. It
// warns where a crash of a node can lose acknowledged writes (no AOF, or
// appendfsync other than always) and where a master has fewer replicas than
// admissions wait for. Then, every Options.Interval, it reads the nodes
// again: a rise of evicted_keys is counted, logged as an error naming what
// may be lost, and makes Status degraded for Options.DegradedFor; a policy
// turned evicting, or a master at its maxmemory, is degraded while it lasts.
package redisguard

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Unknown is the value of a setting a node would not tell.
const Unknown = "unknown"

// Node is what one Redis node says about itself.
type Node struct {
	// Addr is host:port as the client dials it.
	Addr string
	// Role is "master" or "replica" (Unknown when INFO was refused).
	Role string
	// Replicas is a master's connected replicas.
	Replicas int
	// MaxmemoryPolicy is e.g. "noeviction" or "volatile-lru"; Unknown when
	// neither CONFIG GET nor INFO memory tells.
	MaxmemoryPolicy string
	// Maxmemory is the memory limit in bytes: 0 for none, -1 unknown.
	Maxmemory int64
	// UsedMemory is used_memory in bytes; -1 unknown.
	UsedMemory int64
	// AppendOnly is "yes", "no" or Unknown.
	AppendOnly string
	// Appendfsync is "always", "everysec", "no" or Unknown (only CONFIG
	// GET tells it).
	Appendfsync string
	// EvictedKeys is the node's evicted_keys since its start (or CONFIG
	// RESETSTAT); -1 unknown.
	EvictedKeys int64
	// ListpackEntries is zset-max-listpack-entries; -1 unknown.
	ListpackEntries int
	// Config reports that CONFIG GET answered; false: the settings come
	// from INFO alone.
	Config bool
	// Err is why the node could not be read at all; the other fields are
	// then unknown.
	Err error
}

// MayEvict reports whether the node may delete keys to make room: its
// policy is not noeviction, or it could not be read.
func (n Node) MayEvict() bool { return n.MaxmemoryPolicy != "noeviction" }

// CrashSafe reports whether a write the node acknowledged survives its
// crash: AOF on with appendfsync always.
func (n Node) CrashSafe() bool { return n.AppendOnly == "yes" && n.Appendfsync == "always" }

// Full reports a node at its memory limit: under noeviction it refuses
// writes that could grow memory (OOM).
func (n Node) Full() bool { return n.Maxmemory > 0 && n.UsedMemory >= n.Maxmemory }

// MemoryRatio is UsedMemory / Maxmemory; 0 when either is not known or
// there is no limit.
func (n Node) MemoryRatio() float64 {
	if n.Maxmemory <= 0 || n.UsedMemory < 0 {
		return 0
	}
	return float64(n.UsedMemory) / float64(n.Maxmemory)
}

// durability says in a few words how the node keeps writes, e.g.
// "appendonly yes, appendfsync everysec".
func (n Node) durability() string {
	return "appendonly " + n.AppendOnly + ", appendfsync " + n.Appendfsync
}

// Report is what every node of a client says, ordered by address.
type Report struct {
	Nodes []Node
}

// ListpackEntries is the smallest zset-max-listpack-entries of the nodes
// that tell it; -1 when none does.
func (r Report) ListpackEntries() int {
	out := -1
	for _, n := range r.Nodes {
		if n.ListpackEntries >= 0 && (out < 0 || n.ListpackEntries < out) {
			out = n.ListpackEntries
		}
	}
	return out
}

// Read asks every node the client uses: a Cluster's masters and replicas, a
// Ring's shards, or the one node. A node that does not answer is reported
// with Err; the error is for a client whose nodes cannot be listed.
func Read(ctx context.Context, client redis.UniversalClient) (Report, error) {
	var mu sync.Mutex
	var r Report
	each := func(ctx context.Context, c *redis.Client) error {
		n := readNode(ctx, c, c.Options().Addr)
		mu.Lock()
		r.Nodes = append(r.Nodes, n)
		mu.Unlock()
		return nil
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachShard(ctx, each); err != nil {
			return Report{}, fmt.Errorf("redis cluster nodes: %w", err)
		}
	case *redis.Ring:
		if err := c.ForEachShard(ctx, each); err != nil {
			return Report{}, fmt.Errorf("redis ring shards: %w", err)
		}
	case *redis.Client:
		_ = each(ctx, c)
	default:
		r.Nodes = append(r.Nodes, readNode(ctx, client, "redis"))
	}
	slices.SortFunc(r.Nodes, func(a, b Node) int { return cmp.Compare(a.Addr, b.Addr) })
	return r, nil
}

// configNames are the settings read with CONFIG GET, one call each (CONFIG
// GET of several names needs Redis 7), all in one pipeline with the INFO
// sections.
var configNames = []string{"maxmemory-policy", "maxmemory", "appendonly", "appendfsync", "zset-max-listpack-entries"}

var infoSections = []string{"memory", "persistence", "stats", "replication"}

func readNode(ctx context.Context, c redis.Cmdable, addr string) Node {
	n := Node{Addr: addr, Role: Unknown, MaxmemoryPolicy: Unknown, Maxmemory: -1, UsedMemory: -1,
		AppendOnly: Unknown, Appendfsync: Unknown, EvictedKeys: -1, ListpackEntries: -1}
	pipe := c.Pipeline()
	cfg := make([]*redis.MapStringStringCmd, len(configNames))
	for i, name := range configNames {
		cfg[i] = pipe.ConfigGet(ctx, name)
	}
	infos := make([]*redis.StringCmd, len(infoSections))
	for i, s := range infoSections {
		infos[i] = pipe.Info(ctx, s)
	}
	_, _ = pipe.Exec(ctx)

	info := map[string]string{}
	var infoErr error
	for _, cmd := range infos {
		text, err := cmd.Result()
		if err != nil {
			infoErr = cmp.Or(infoErr, err)
			continue
		}
		for _, line := range strings.Split(text, "\n") {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
				info[k] = v
			}
		}
	}
	conf := map[string]string{}
	var confErr error
	for i, cmd := range cfg {
		m, err := cmd.Result()
		if err != nil {
			confErr = cmp.Or(confErr, err)
			continue
		}
		if v, ok := m[configNames[i]]; ok {
			conf[configNames[i]] = v
		}
	}
	n.Config = confErr == nil
	if len(info) == 0 && len(conf) == 0 {
		n.Err = cmp.Or(infoErr, confErr, fmt.Errorf("no settings in the replies"))
		return n
	}
	if v := cmp.Or(conf["maxmemory-policy"], info["maxmemory_policy"]); v != "" {
		n.MaxmemoryPolicy = v
	}
	n.Maxmemory = number(cmp.Or(conf["maxmemory"], info["maxmemory"]), -1)
	n.UsedMemory = number(info["used_memory"], -1)
	n.EvictedKeys = number(info["evicted_keys"], -1)
	n.ListpackEntries = int(number(conf["zset-max-listpack-entries"], -1))
	switch v := cmp.Or(conf["appendonly"], info["aof_enabled"]); v {
	case "yes", "1":
		n.AppendOnly = "yes"
	case "no", "0":
		n.AppendOnly = "no"
	}
	if v := conf["appendfsync"]; v != "" {
		n.Appendfsync = v
	}
	switch info["role"] {
	case "master":
		n.Role = "master"
		n.Replicas = int(number(info["connected_slaves"], 0))
	case "slave":
		n.Role = "replica"
	}
	return n
}

func number(s string, unknown int64) int64 {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return unknown
	}
	return v
}
