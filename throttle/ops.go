package throttle

import "time"

// The limiter library's operations (scripts/limiter.lua), one encoder each.
// An encoder holds what its operation needs; its encode method writes the
// operation's KEYS and ARGV in the order the header of its scripts/op_*.lua
// lists them, each value under the name that header gives it, and build
// turns it into the op a batch carries. TestEncodersMatchLuaHeaders
// (ops_contract_internal_test.go) reads every header and checks every
// encoder against its own: the names, their order and how many.

// The opcodes, as the op_*.lua files register them.
const (
	opReserve = "R"
	opPlace   = "P"
	opDone    = "D"
	opRelease = "X"
	opState   = "S"
	opUsage   = "U"
	opHold    = "H"
	opLease   = "L"
	opFree    = "F"
	opBreaker = "B"
)

// encoder is one operation of the library.
type encoder interface {
	code() string
	encode(e *enc)
}

// enc collects one operation's KEYS and ARGV. names is nil but in the
// contract test, which has each value recorded with its name.
type enc struct {
	op    op
	names *[]named
}

// named is one value an encoder wrote: its table ("KEYS" or "ARGV"), its
// name in the Lua header, and the value.
type named struct {
	table, name string
	value       any
}

// newEnc starts an operation with room for its keys and arguments.
func newEnc(code string, keys, args int) enc {
	return enc{op: op{code: code, keys: make([]string, 0, keys), args: make([]any, 0, args)}}
}

// key writes the next of the operation's KEYS.
func (e *enc) key(name, k string) {
	e.op.keys = append(e.op.keys, k)
	if e.names != nil {
		*e.names = append(*e.names, named{"KEYS", name, k})
	}
}

// arg writes the next of the operation's ARGV.
func (e *enc) arg(name string, v any) {
	e.op.args = append(e.op.args, v)
	if e.names != nil {
		*e.names = append(*e.names, named{"ARGV", name, v})
	}
}

// reserveOp is "R" (scripts/op_reserve.lua): Reserve's and Allow's check.
type reserveOp struct {
	rules    []string // one key per limit
	state    string   // the id's record; "" without a policy (Allow)
	member   string   // the id as the windows store it
	policy   RerunPolicy
	limits   []Limit
	opts     ReserveOptions
	stateTTL time.Duration
	table    func() time.Time    // where a calendar table starts (Limiter.tableFrom)
	subject  func(string) string // keys a distinct rule's subject (Limiter.Subject)
}

func (o *reserveOp) code() string { return opReserve }

func (o *reserveOp) build() *op {
	opts := o.opts
	e := newEnc(opReserve, len(o.rules)+stateKeys(o.policy, opts),
		20+3*len(o.limits)+2*len(opts.Closed)+counterArgsLen(o.limits)+distinctArgsLen(o.limits))
	o.encode(&e)
	return &e.op
}

func (o *reserveOp) encode(e *enc) {
	opts, cc, note := o.opts, o.opts.Consent, o.opts.Note
	for _, k := range o.rules {
		e.key("rule", k)
	}
	if o.state != "" {
		e.key("state", o.state)
		if opts.Block != "" {
			e.key("block", opts.Block)
		}
		if cc != nil {
			e.key("consent", cc.Key)
			if cc.LastKey != "" {
				e.key("last", cc.LastKey)
			}
		}
		if note != nil {
			e.key("note", note.Key)
		}
		for _, h := range opts.Holds {
			e.key("hold", h)
		}
	}
	e.arg("member", o.member)
	e.arg("policy", string(o.policy))
	e.arg("slack_ms", opts.Slack.Milliseconds())
	e.arg("horizon_ms", opts.Horizon.Milliseconds())
	e.arg("book", boolArg(opts.Book))
	e.arg("tmin_ms", timeArg(opts.NotBefore))
	e.arg("late_ms", opts.late.Milliseconds())
	e.arg("deadline_ms", timeArg(opts.Deadline))
	e.arg("state_ttl_ms", o.stateTTL.Milliseconds())
	e.arg("nonce", opts.Nonce)
	e.arg("block", boolArg(opts.Block != ""))
	if cc != nil {
		e.arg("consent", "1")
		e.arg("category", cc.Category)
		e.arg("exempt", boolArg(cc.Exempt))
		e.arg("last_ttl_ms", cc.LastTTL.Milliseconds())
	} else {
		e.arg("consent", "0")
		e.arg("category", "")
		e.arg("exempt", "0")
		e.arg("last_ttl_ms", 0)
	}
	if note != nil {
		e.arg("note_ttl_ms", note.TTL.Milliseconds())
		e.arg("note_value", note.Value)
	} else {
		e.arg("note_ttl_ms", 0)
		e.arg("note_value", "")
	}
	e.arg("n", len(o.limits))
	e.arg("nc", len(opts.Closed))
	e.arg("nh", len(opts.Holds))
	for _, lim := range o.limits {
		e.arg("limit", lim.Rule.Limit)
		e.arg("window_ms", lim.Rule.Window.Milliseconds())
		e.arg("drop", boolArg(lim.Drop))
	}
	closed(e, opts.Closed)
	counters(e, o.limits, o.from)
	distinct(e, o.limits, o.subject)
}

// from is where a calendar rule's table of boundaries starts: a little
// before the clock, or before NotBefore when that is earlier.
func (o *reserveOp) from() time.Time {
	t := o.table()
	if nb := o.opts.NotBefore; !nb.IsZero() && nb.Before(t) {
		t = nb.Add(-calendarMargin)
	}
	return t
}

// closed writes the closed intervals' ends (their count goes before).
func closed(e *enc, ivs []Interval) {
	for _, iv := range ivs {
		e.arg("start_ms", iv.Start.UnixMilli())
		e.arg("end_ms", iv.End.UnixMilli())
	}
}

// placeOp is "P" (scripts/op_place.lua): a check's limits in another group
// of a Cluster (across.go).
type placeOp struct {
	rules  []string
	member string // with "#<attempt>" past the first attempt
	slack  time.Duration
	tmin   time.Time // the slot the groups placed so far agree on; zero: none
	lead   time.Duration
	limits []Limit
	closed []Interval
}

func (o *placeOp) code() string { return opPlace }

func (o *placeOp) build() *op {
	e := newEnc(opPlace, len(o.rules), 4+2*len(o.limits)+1+2*len(o.closed))
	o.encode(&e)
	return &e.op
}

func (o *placeOp) encode(e *enc) {
	for _, k := range o.rules {
		e.key("rule", k)
	}
	e.arg("member", o.member)
	e.arg("slack_ms", o.slack.Milliseconds())
	e.arg("tmin_ms", timeArg(o.tmin))
	e.arg("lead_ms", o.lead.Milliseconds())
	e.arg("nc", len(o.closed))
	for _, lim := range o.limits {
		e.arg("limit", lim.Rule.Limit)
		e.arg("window_ms", lim.Rule.Window.Milliseconds())
	}
	closed(e, o.closed)
}

// doneOp is "D" (scripts/op_done.lua): MarkDone.
type doneOp struct {
	state   string
	attempt int
	ttl     time.Duration
}

func (o *doneOp) code() string { return opDone }

func (o *doneOp) build() *op {
	e := newEnc(opDone, 1, 2)
	o.encode(&e)
	return &e.op
}

func (o *doneOp) encode(e *enc) {
	e.key("state", o.state)
	e.arg("attempt", o.attempt)
	e.arg("ttl_ms", o.ttl.Milliseconds())
}

// releaseOp is "X" (scripts/op_release.lua): Release, in one group.
type releaseOp struct {
	rules   []string
	state   string // the id's record (never written outside its own group)
	member  string // the id as the windows store it
	attempt int
	limits  []Limit
	table   func() time.Time    // where a calendar table starts (Limiter.tableFrom)
	subject func(string) string // keys a distinct rule's subject (Limiter.Subject)
}

func (o *releaseOp) code() string { return opRelease }

func (o *releaseOp) build() *op {
	e := newEnc(opRelease, len(o.rules)+1, 2+counterArgsLen(o.limits)+distinctArgsLen(o.limits))
	o.encode(&e)
	return &e.op
}

func (o *releaseOp) encode(e *enc) {
	for _, k := range o.rules {
		e.key("rule", k)
	}
	e.key("state", o.state)
	e.arg("member", o.member)
	e.arg("attempt", o.attempt)
	counters(e, o.limits, o.table)
	distinct(e, o.limits, o.subject)
}

// stateOp is "S" (scripts/op_state.lua): an id's record, read first by a
// check across Cluster groups.
type stateOp struct{ state string }

func (o *stateOp) code() string { return opState }

func (o *stateOp) build() *op {
	e := newEnc(opState, 1, 0)
	o.encode(&e)
	return &e.op
}

func (o *stateOp) encode(e *enc) { e.key("state", o.state) }

// usageOp is "U" (scripts/op_usage.lua): Usage, in one group.
type usageOp struct {
	rules   []string
	slack   time.Duration
	limits  []Limit
	table   func() time.Time    // where a calendar table starts (Limiter.tableFrom)
	subject func(string) string // keys a distinct rule's subject (Limiter.Subject)
}

func (o *usageOp) code() string { return opUsage }

func (o *usageOp) build() *op {
	e := newEnc(opUsage, len(o.rules), 2+2*len(o.limits)+counterArgsLen(o.limits)+distinctArgsLen(o.limits))
	o.encode(&e)
	return &e.op
}

func (o *usageOp) encode(e *enc) {
	for _, k := range o.rules {
		e.key("rule", k)
	}
	e.arg("slack_ms", o.slack.Milliseconds())
	e.arg("n", len(o.limits))
	for _, lim := range o.limits {
		e.arg("limit", lim.Rule.Limit)
		e.arg("window_ms", lim.Rule.Window.Milliseconds())
	}
	counters(e, o.limits, o.table)
	distinct(e, o.limits, o.subject)
}

// holdOp is "H" (scripts/op_hold.lua): Hold.
type holdOp struct {
	hold                     string // the key (HoldKey)
	retry, base, max, linger time.Duration
	answer                   int           // the provider's answer (429, 20429, 421, ...)
	sentAgo                  time.Duration // how long ago the answered request was sent
	events                   string        // the channel a change is announced on (ProviderEvents)
}

func (o *holdOp) code() string { return opHold }

func (o *holdOp) build() *op {
	e := newEnc(opHold, 1, 7)
	o.encode(&e)
	return &e.op
}

func (o *holdOp) encode(e *enc) {
	e.key("hold", o.hold)
	e.arg("retry_ms", o.retry.Milliseconds())
	e.arg("base_ms", o.base.Milliseconds())
	e.arg("max_ms", o.max.Milliseconds())
	e.arg("linger_ms", o.linger.Milliseconds())
	e.arg("code", o.answer)
	e.arg("sent_ago_ms", o.sentAgo.Milliseconds())
	e.arg("events", o.events)
}

// leaseOp is "L" (scripts/op_lease.lua): Acquire, in one group.
type leaseOp struct {
	leases []string // one key per cap (CapKey)
	holder string
	ttl    time.Duration
	caps   []Cap
}

func (o *leaseOp) code() string { return opLease }

func (o *leaseOp) build() *op {
	e := newEnc(opLease, len(o.leases), 2+len(o.caps))
	o.encode(&e)
	return &e.op
}

func (o *leaseOp) encode(e *enc) {
	for _, k := range o.leases {
		e.key("lease", k)
	}
	e.arg("holder", o.holder)
	e.arg("ttl_ms", o.ttl.Milliseconds())
	for _, c := range o.caps {
		e.arg("max", c.Max)
	}
}

// freeOp is "F" (scripts/op_free.lua): Free, in one group.
type freeOp struct {
	leases []string
	holder string
}

func (o *freeOp) code() string { return opFree }

func (o *freeOp) build() *op {
	e := newEnc(opFree, len(o.leases), 1)
	o.encode(&e)
	return &e.op
}

func (o *freeOp) encode(e *enc) {
	for _, k := range o.leases {
		e.key("lease", k)
	}
	e.arg("holder", o.holder)
}
