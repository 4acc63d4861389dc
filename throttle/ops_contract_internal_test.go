package throttle

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The contract between the Go encoders (ops.go) and the Lua they feed: each
// scripts/op_*.lua opens with lines like
//
//	-- KEYS[1..n]  -> n × rule: …
//	-- KEYS[n+1]   -> state: …
//	-- ARGV[1]     -> member: …
//	-- ARGV[13...] -> n × limit, window_ms, drop: …
//	-- ARGV[...]   -> counters: … (the "counters[…]" lines of limiter_counter.lua)
//
// where the text before the first ':' names the values, in order: a name,
// or "count × names…", the names after it repeated count times (count is a
// value named before, or the number of KEYS of that name). The encoders
// write every value under its name; this test replays what each encoder
// wrote, for samples that take every branch, against its operation's
// header: the same names, in the same order, repeated as often as their
// counts say, and nothing more. A KEYS line may be absent from a call (the
// header says when); its place in the order may not change.

// item is one entry of a header: a value's name, or a repeat (name is then
// the count's name, group what it repeats).
type item struct {
	name  string
	group []item
}

// contract is one operation's header.
type contract struct {
	file       string
	code       string
	keys, argv []item
}

var (
	headerLine = regexp.MustCompile(`^-- (\w+)\[([^\]]*)\]\s*->\s*(.+)$`)
	opcodeLine = regexp.MustCompile(`Opcode "(\w)"`)
	valueName  = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// readHeader parses the leading comment block of a Lua file: its opcode and
// its table lines, by table ("KEYS", "ARGV", or a named block like
// "counters"). Numbered positions must count the values before them.
func readHeader(path string) (string, map[string][]item, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	code, tables := "", map[string][]item{}
	varied := map[string]bool{} // a table past a repeat, whose positions vary
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		if m := opcodeLine.FindStringSubmatch(line); m != nil && code == "" {
			code = m[1]
		}
		m := headerLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		table, pos, spec := m[1], m[2], m[3]
		spec, _, _ = strings.Cut(spec, ":")
		items, err := parseItems(spec)
		if err != nil {
			return "", nil, fmt.Errorf("%s: %s[%s]: %w", filepath.Base(path), table, pos, err)
		}
		first := strings.SplitN(strings.TrimSuffix(pos, "..."), "..", 2)[0]
		if n, err := strconv.Atoi(first); err == nil && !varied[table] && n != len(tables[table])+1 {
			return "", nil, fmt.Errorf("%s: %s[%s] is value %d of the header", filepath.Base(path), table, pos, len(tables[table])+1)
		}
		for _, it := range items {
			varied[table] = varied[table] || it.group != nil
		}
		tables[table] = append(tables[table], items...)
	}
	return code, tables, nil
}

// parseItems reads "a, b, n × c, d": a repeat takes every name after it.
func parseItems(spec string) ([]item, error) {
	parts := strings.Split(spec, ",")
	var out []item
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if count, first, ok := strings.Cut(p, "×"); ok {
			group, err := parseItems(strings.Join(append([]string{first}, parts[i+1:]...), ","))
			if err != nil {
				return nil, err
			}
			count = strings.TrimSpace(count)
			if !valueName.MatchString(count) {
				return nil, fmt.Errorf("count %q is not a name", count)
			}
			return append(out, item{name: count, group: group}), nil
		}
		if !valueName.MatchString(p) {
			return nil, fmt.Errorf("%q is not a name", p)
		}
		out = append(out, item{name: p})
	}
	return out, nil
}

// readContracts reads every op_*.lua header and the named blocks they use.
func readContracts(t *testing.T) (map[string]contract, map[string][]item) {
	t.Helper()
	_, blocks, err := readHeader("../scripts/limiter_counter.lua")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks["counters"]) == 0 {
		t.Fatal("limiter_counter.lua has no counters[…] lines")
	}
	_, dblocks, err := readHeader("../scripts/limiter_distinct.lua")
	if err != nil {
		t.Fatal(err)
	}
	if len(dblocks["distinct"]) == 0 {
		t.Fatal("limiter_distinct.lua has no distinct[…] lines")
	}
	files, err := filepath.Glob("../scripts/op_*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no op_*.lua files: %v", err)
	}
	out := map[string]contract{}
	for _, f := range files {
		code, tables, err := readHeader(f)
		if err != nil {
			t.Fatal(err)
		}
		if code == "" || len(tables["KEYS"]) == 0 {
			t.Fatalf("%s: no `Opcode \"X\"` or no KEYS lines in its header", filepath.Base(f))
		}
		src, _ := os.ReadFile(f)
		if !strings.Contains(string(src), "\nops."+code+", opnames."+code+" = ") {
			t.Fatalf("%s: its header says opcode %q, but it does not register ops.%s", filepath.Base(f), code, code)
		}
		out[code] = contract{file: filepath.Base(f), code: code, keys: tables["KEYS"], argv: tables["ARGV"]}
	}
	return out, map[string][]item{"counters": blocks["counters"], "distinct": dblocks["distinct"]}
}

// replay checks what an encoder wrote (its values, named) against its
// header, and notes the names it saw in seen.
type replay struct {
	c      contract
	blocks map[string][]item
	got    []named // ARGV only
	at     int
	counts map[string]int // the integer values written so far, by name, and the KEYS counts
	keyed  map[string]int // the KEYS counts alone
	seen   map[string]bool
}

// matchKeys walks the header's KEYS in order: each key written must come
// at its place; a repeat binds its count to how many keys of its name came.
func (r *replay) matchKeys(keys []named) error {
	j := 0
	for _, it := range r.c.keys {
		if it.group != nil {
			n := 0
			for j < len(keys) && keys[j].name == it.group[0].name {
				j, n = j+1, n+1
			}
			r.counts[it.name], r.keyed[it.name] = n, n
			if n > 0 {
				r.seen["KEYS "+it.group[0].name] = true
			}
			continue
		}
		if j < len(keys) && keys[j].name == it.name {
			r.seen["KEYS "+it.name] = true
			j++
		}
	}
	if j < len(keys) {
		return fmt.Errorf("KEYS[%d]: Go writes %q, which %s does not list there (its KEYS: %s)", j+1, keys[j].name, r.c.file, names(r.c.keys))
	}
	return nil
}

// matchArgs walks items against the values written from r.at on.
func (r *replay) matchArgs(items []item) error {
	for _, it := range items {
		if block, ok := r.blocks[it.name]; ok && it.group == nil {
			if err := r.matchArgs(block); err != nil {
				return fmt.Errorf("in %s: %w", it.name, err)
			}
			continue
		}
		if it.group != nil {
			n, ok := r.counts[it.name]
			if !ok {
				return fmt.Errorf("%s repeats %s × …, but no value or KEYS before it is named %s", r.c.file, it.name, it.name)
			}
			for range n {
				if err := r.matchArgs(it.group); err != nil {
					return err
				}
			}
			continue
		}
		if r.at >= len(r.got) {
			return fmt.Errorf("ARGV[%d]: %s lists %s, Go writes nothing more", r.at+1, r.c.file, it.name)
		}
		g := r.got[r.at]
		if g.name != it.name {
			return fmt.Errorf("ARGV[%d]: Go writes %s where %s lists %s", r.at+1, g.name, r.c.file, it.name)
		}
		r.seen["ARGV "+it.name] = true
		if v, ok := intOf(g.value); ok {
			if want, keyed := r.keyed[it.name]; keyed && v != want {
				return fmt.Errorf("ARGV[%d]: %s = %d, but Go writes %d KEYS it counts", r.at+1, it.name, v, want)
			}
			r.counts[it.name] = v
		}
		r.at++
	}
	return nil
}

func intOf(v any) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case int64:
		return int(x), true
	case string:
		n, err := strconv.Atoi(x)
		return n, err == nil
	}
	return 0, false
}

// names lists a header's items as they read.
func names(items []item) string {
	var b []string
	for _, it := range items {
		if it.group != nil {
			b = append(b, it.name+" × "+names(it.group))
			continue
		}
		b = append(b, it.name)
	}
	return strings.Join(b, ", ")
}

// allNames are the names a header's items hold, blocks expanded, as seen keys.
func allNames(table string, items []item, blocks map[string][]item) []string {
	var out []string
	for _, it := range items {
		switch block, ok := blocks[it.name]; {
		case ok && it.group == nil:
			out = append(out, allNames(table, block, blocks)...)
		case it.group != nil:
			out = append(out, allNames(table, it.group, blocks)...)
		default:
			out = append(out, table+" "+it.name)
		}
	}
	return out
}

// check replays one encoder against its contract.
func check(c contract, blocks map[string][]item, o encoder, seen map[string]bool) error {
	var trace []named
	e := enc{names: &trace}
	o.encode(&e)
	var keys, args []named
	for _, n := range trace {
		if n.table == "KEYS" {
			keys = append(keys, n)
		} else {
			args = append(args, n)
		}
	}
	r := &replay{c: c, blocks: blocks, got: args, counts: map[string]int{}, keyed: map[string]int{}, seen: seen}
	if err := r.matchKeys(keys); err != nil {
		return err
	}
	if err := r.matchArgs(c.argv); err != nil {
		return err
	}
	if r.at < len(args) {
		return fmt.Errorf("ARGV[%d]: Go writes %s and %d more values past the end of %s's ARGV", r.at+1, args[r.at].name, len(args)-r.at-1, c.file)
	}
	return nil
}

// contractSamples are encoders of every operation, as the Limiter builds
// them, taking every branch of every header between them.
func contractSamples(t *testing.T) []encoder {
	t.Helper()
	l, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Options{Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	at := time.UnixMilli(1_716_873_600_000)
	limits := []Limit{
		{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 1, Window: time.Minute}, Drop: true},
		{Scope: "sms:tenant", Rule: Rule{Limit: 1000, Window: time.Hour, Buckets: 60}},
		{Scope: "sms:tenant", Rule: PerCalendar(2000, Day, "America/Los_Angeles")},
		{Scope: "whatsapp:tenant", Distinct: "+1", Rule: Rule{Limit: 250, Window: time.Minute, Distinct: true}},
	}
	closed := []Interval{{Start: at, End: at.Add(time.Hour)}, {Start: at.Add(2 * time.Hour), End: at.Add(3 * time.Hour)}}
	keys, err := l.keys("g", limits)
	if err != nil {
		t.Fatal(err)
	}
	full := ReserveOptions{Slack: time.Second, Horizon: time.Second, Book: true, NotBefore: at, Deadline: at.Add(time.Hour),
		Closed: closed, Block: "blocked", Holds: []string{l.HoldKey("sms:provider", ""), l.HoldKey("sms:from", "+2")},
		Consent: &ConsentCheck{Key: "c", Category: "news", Exempt: true, LastKey: "last", LastTTL: time.Hour},
		Note:    &Note{Key: "note", Value: "+1", TTL: time.Hour}, Nonce: "run1"}
	var out []encoder
	for _, c := range []struct {
		policy RerunPolicy
		opts   ReserveOptions
		limits []Limit
	}{
		{"", ReserveOptions{}, limits[:1]},
		{AtLeastOnce, full, limits},
		{AtMostOnce, ReserveOptions{Consent: &ConsentCheck{Key: "c", Category: "otp"}}, limits[:2]},
	} {
		o, err := l.reserveOp("g", "id", c.policy, c.opts, c.limits)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	caps := []Cap{{Scope: "sms:provider", Max: 3}, {Scope: "sms:from", Subject: "+2", Max: 1}}
	return append(out,
		&placeOp{rules: keys[:1], member: "id#2", slack: time.Second, tmin: at, lead: agreeLead, limits: limits[:1], closed: closed},
		&doneOp{state: l.StateKey("g", "id"), attempt: 2, ttl: time.Hour},
		&releaseOp{rules: keys, state: l.StateKey("g", "id"), member: "id", attempt: 2, limits: limits, table: l.tableFrom, subject: l.Subject},
		&stateOp{state: l.StateKey("g", "id")},
		&usageOp{rules: keys, slack: time.Second, limits: limits, table: l.tableFrom, subject: l.Subject},
		&holdOp{hold: l.HoldKey("sms:provider", ""), retry: time.Second, base: time.Second, max: time.Minute, linger: holdLinger, answer: 429},
		&leaseOp{leases: []string{"a", "b"}, holder: "id#1", ttl: time.Minute, caps: caps},
		&freeOp{leases: []string{"a", "b"}, holder: "id#1"},
		&breakerOp{breaker: l.BreakerKey("sms", "backup"), index: l.breakerIndex(), mode: breakerFailed, policy: BreakerPolicy{Failures: 3, Window: time.Second, Cooldown: time.Second}, linger: breakerLinger},
	)
}

// Every encoder writes what its operation's Lua header lists, and builds
// exactly that; every header is exercised whole; every operation has an
// encoder.
func TestEncodersMatchLuaHeaders(t *testing.T) {
	contracts, blocks := readContracts(t)
	seen := map[string]map[string]bool{}
	failed := map[string]bool{} // operations whose replay failed: their coverage means nothing
	for _, o := range contractSamples(t) {
		c, ok := contracts[o.code()]
		if !ok {
			t.Errorf("no op_*.lua registers opcode %q, which %T writes", o.code(), o)
			continue
		}
		if seen[c.code] == nil {
			seen[c.code] = map[string]bool{}
		}
		if err := check(c, blocks, o, seen[c.code]); err != nil {
			t.Errorf("%T against %s: %v", o, c.file, err)
			failed[c.code] = true
		}
		// build sends exactly what encode wrote.
		var trace []named
		e := enc{names: &trace}
		o.encode(&e)
		built := o.(interface{ build() *op }).build()
		if built.code != o.code() || !slices.Equal(built.keys, e.op.keys) || len(built.args) != len(e.op.args) ||
			len(e.op.args) > 0 && !reflect.DeepEqual(built.args, e.op.args) {
			t.Errorf("%T: build sends %+v, encode wrote %+v", o, *built, e.op)
		}
	}
	for code, c := range contracts {
		if seen[code] == nil {
			t.Errorf("%s (opcode %q) has no Go encoder", c.file, code)
			continue
		}
		if failed[code] {
			continue
		}
		for _, n := range append(allNames("KEYS", c.keys, blocks), allNames("ARGV", c.argv, blocks)...) {
			if !seen[code][n] {
				t.Errorf("%s: no sample writes %s", c.file, n)
			}
		}
	}
}

// The replay fails where an encoder and its header disagree: two values
// swapped, one missing, one too many, a key out of its place.
func TestContractReplayCatchesDisagreement(t *testing.T) {
	contracts, blocks := readContracts(t)
	c := contracts[opReserve]
	o, ok := contractSamples(t)[1].(*reserveOp)
	if !ok {
		t.Fatal("the second sample is not the full reserve")
	}
	if err := check(c, blocks, o, map[string]bool{}); err != nil {
		t.Fatalf("the full reserve: %v", err)
	}
	for name, edit := range map[string]func(*contract){
		"SwappedArgs": func(c *contract) { c.argv[2], c.argv[3] = c.argv[3], c.argv[2] },
		"MissingArg":  func(c *contract) { c.argv = append(c.argv[:4:4], c.argv[5:]...) },
		"ExtraArg":    func(c *contract) { c.argv = append(c.argv[:1:1], append([]item{{name: "extra"}}, c.argv[1:]...)...) },
		"ShortHeader": func(c *contract) { c.argv = c.argv[:len(c.argv)-1] },
		"SwappedKeys": func(c *contract) { c.keys[2], c.keys[3] = c.keys[3], c.keys[2] },
		"WrongRepeats": func(c *contract) {
			for i, it := range c.argv {
				if it.group != nil && it.name == "n" {
					c.argv[i].name = "nh"
				}
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad := contract{file: c.file, code: c.code, keys: append([]item(nil), c.keys...), argv: append([]item(nil), c.argv...)}
			edit(&bad)
			if err := check(bad, blocks, o, map[string]bool{}); err == nil {
				t.Fatalf("a header reading %s / %s passed", names(bad.keys), names(bad.argv))
			}
		})
	}
}
