package plans

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// ErrBadRules reports a rule list that does not parse; the message names the entry.
var ErrBadRules = errors.New("bad rules")

// Scopes a rate rule can count over.
const (
	ScopeRecipient = "recipient" // per normalised address or number
	ScopeTenant    = "tenant"    // everything the tenant sends on the channel (and category)
	ScopeSender    = "sender"    // per From number / sender id / From address, across tenants
	ScopeProvider  = "provider"  // everything the deployment sends on the channel
	ScopeUser      = "user"      // per person (the notification's user), on every channel the rule names
)

// AnyChannel in a user rule ("*.marketing:user=3/1d") counts a person's
// sends on every channel in one window.
const AnyChannel tasks.Channel = "*"

// Kind is what an entry of the grammar says.
type Kind int

// The kinds of entries.
const (
	KindRate          Kind = iota // CHANNEL[.CATEGORY]:SCOPE=LIMIT/WINDOW [drop]
	KindExempt                    // CHANNEL.CATEGORY:exempt — a priority lane
	KindQuiet                     // CHANNEL[.CATEGORY]:quiet=HH:MM-HH:MM or sms[.CATEGORY]:quiet=tcpa
	KindMaxDefer                  // CHANNEL[.CATEGORY]:max-defer=DURATION
	KindRerun                     // CHANNEL[.CATEGORY]:rerun=at-least-once|at-most-once
	KindZone                      // [TENANT/]tz=ZONE — the default zone for quiet hours
	KindBulk                      // CHANNEL[.CATEGORY]:bulk — the bulk lane; email also needs a List-Unsubscribe (RFC 8058)
	KindUnsubscribe               // email[.CATEGORY]:unsubscribe=TARGET — the default List-Unsubscribe
	KindShard                     // TENANT/shard=K — the tenant's queues get shard K to themselves
	KindConsentExempt             // CHANNEL.CATEGORY:consent=exempt — goes after an opt-out of every category
	KindOptOut                    // CHANNEL:optout=all|category — what an opt-out covers
	KindReply                     // sms:reply-stop|start|help=TEXT — the reply to a keyword
	KindKeywords                  // sms:keywords-stop|start|help=WORD … — words besides the standard ones
	KindConcurrency               // CHANNEL[.CATEGORY]:SCOPE:concurrency=N — at most N sends in flight at once
	KindWeight                    // TENANT/weight=N — the tenant's share of a lane's dequeues, under contention
	KindProviders                 // [TENANT/]CHANNEL:providers=A+B — the channel's providers, in order
	KindDigest                    // CHANNEL[.CATEGORY]:digest=max:N[+window:D][+key:FIELD] — fold deferred sends into one
	KindRequireUser               // CHANNEL[.CATEGORY]:user=required — a notification must name its person
	KindInbound                   // TENANT/sms:inbound=NUMBER|ID… — the numbers and messaging profiles whose inbound messages are the tenant's
)

// MaxWeight bounds a tenant's weight (KindWeight).
const MaxWeight = 1000

// Rerun policies (KindRerun).
const (
	AtLeastOnce = "at-least-once"
	AtMostOnce  = "at-most-once"
)

// Entry is one entry of a rule list.
type Entry struct {
	Tenant    string        // "" for a default that applies to every tenant
	Channel   tasks.Channel // empty for KindZone
	Category  string        // "" for every category but the exempt ones
	Kind      Kind
	Scope     string        // KindRate
	Rule      throttle.Rule // KindRate
	Drop      bool          // KindRate: a full window drops the send instead of deferring it
	Quiet     QuietHours    // KindQuiet
	MaxDefer  time.Duration // KindMaxDefer
	Rerun     string        // KindRerun
	Zone      string        // KindZone: an IANA zone name
	Target    string        // KindUnsubscribe: https URL and/or mailto, {id} replaced by the notification id
	Shard     int           // KindShard: the shard index (below SLUICE_QUEUE_SHARDS)
	Weight    int           // KindWeight: 1 to MaxWeight
	OptOut    string        // KindOptOut: OptOutAll or OptOutCategory
	Reply     string        // KindReply, KindKeywords: which keyword (stop, start, help)
	Text      string        // KindReply: the reply
	Words     []string      // KindKeywords
	QueuedCap int64         // KindMaxQueued, KindMaxQueuedBytes (queued.go)
	Max       int           // KindConcurrency: sends in flight at once
	Providers []string      // KindProviders: provider names (SLUICE_*_PROVIDERS), in the order tried
	Digest    *Digest       // KindDigest
	Inbound   []string      // KindInbound: E.164 numbers, messaging profile ids, Messaging Service SIDs
}

// String prints the entry in the grammar Parse reads.
func (e Entry) String() string {
	var b strings.Builder
	if e.Tenant != "" {
		b.WriteString(e.Tenant + "/")
	}
	if e.Kind == KindZone {
		b.WriteString("tz=" + e.Zone)
		return b.String()
	}
	if e.Kind == KindShard {
		b.WriteString("shard=" + strconv.Itoa(e.Shard))
		return b.String()
	}
	if e.Kind == KindWeight {
		b.WriteString("weight=" + strconv.Itoa(e.Weight))
		return b.String()
	}
	if q, ok := e.queuedCapString(); ok {
		return b.String() + q
	}
	b.WriteString(string(e.Channel))
	if e.Category != "" {
		b.WriteString("." + e.Category)
	}
	b.WriteByte(':')
	switch e.Kind {
	case KindConcurrency:
		b.WriteString(e.Scope + ":concurrency=" + strconv.Itoa(e.Max))
	case KindRate:
		b.WriteString(e.Scope + "=" + e.Rule.String())
		if e.Drop {
			b.WriteString(" drop")
		}
	case KindExempt:
		b.WriteString("exempt")
	case KindQuiet:
		b.WriteString("quiet=" + e.Quiet.String())
	case KindMaxDefer:
		b.WriteString("max-defer=" + throttle.FormatWindow(e.MaxDefer))
	case KindRerun:
		b.WriteString("rerun=" + e.Rerun)
	case KindBulk:
		b.WriteString("bulk")
	case KindUnsubscribe:
		b.WriteString("unsubscribe=" + e.Target)
	case KindProviders:
		b.WriteString("providers=" + strings.Join(e.Providers, "+"))
	case KindDigest:
		b.WriteString("digest=" + e.Digest.String())
	case KindInbound:
		b.WriteString("inbound=" + strings.Join(e.Inbound, "|"))
	case KindRequireUser:
		b.WriteString(ScopeUser + "=required")
	default:
		b.WriteString(e.consentString())
	}
	return b.String()
}

// Scope string of a rate entry in the limiter's keys: "sms:recipient",
// "sms.marketing:tenant". Rules of a category count in their own windows.
// A rule of every channel ('*') is "all.marketing:user" (keys take no '*';
// no channel is named "all").
func (e Entry) LimitScope() string {
	ch := string(e.Channel)
	if e.Channel == AnyChannel {
		ch = "all"
	}
	if e.Category != "" {
		ch += "." + e.Category
	}
	return ch + ":" + e.Scope
}

// Policy is a parsed rule list: defaults and per-tenant entries.
type Policy struct {
	entries    []Entry
	categories map[string]bool     // the categories the entries name
	pins       tasks.Pins          // TENANT/shard=K
	weights    map[string]int      // TENANT/weight=N
	providers  map[string][]string // [TENANT/]CHANNEL:providers=A+B, by tenant + "/" + channel
	inbound    map[string][]string // TENANT/sms:inbound=…: number or id → the tenants that own it
}

// Names reports whether an entry of the policy names category.
func (p Policy) Names(category string) bool { return p.categories[category] }

// index records what the entries name; every constructor calls it.
func (p *Policy) index() {
	p.categories = map[string]bool{}
	p.pins, p.weights, p.providers, p.inbound = nil, nil, nil, nil
	for _, e := range p.entries {
		if e.Kind == KindInbound && e.Tenant != "" {
			if p.inbound == nil {
				p.inbound = map[string][]string{}
			}
			for _, v := range e.Inbound {
				if !slices.Contains(p.inbound[v], e.Tenant) {
					p.inbound[v] = append(p.inbound[v], e.Tenant)
				}
			}
		}
		if e.Kind == KindProviders {
			if p.providers == nil {
				p.providers = map[string][]string{}
			}
			p.providers[e.Tenant+"/"+string(e.Channel)] = e.Providers
		}
		if e.Category != "" {
			p.categories[e.Category] = true
		}
		if e.Kind == KindShard && e.Tenant != "" {
			if p.pins == nil {
				p.pins = tasks.Pins{}
			}
			p.pins[e.Tenant] = e.Shard
		}
		if e.Kind == KindWeight && e.Tenant != "" {
			if p.weights == nil {
				p.weights = map[string]int{}
			}
			p.weights[e.Tenant] = e.Weight
		}
	}
}

// Parse reads a rule list: entries separated by commas or new lines, '#'
// starting a comment to the end of its line. Each entry is
//
//	[TENANT/]CHANNEL[.CATEGORY]:SCOPE=LIMIT/WINDOW [drop]   a rate rule
//	[TENANT/]CHANNEL[.CATEGORY]:SCOPE:concurrency=N         at most N sends in flight at once
//	[TENANT/]CHANNEL.CATEGORY:exempt                        a priority lane
//	[TENANT/]CHANNEL[.CATEGORY]:quiet=HH:MM-HH:MM           quiet hours, recipient's local time
//	[TENANT/]sms[.CATEGORY]:quiet=tcpa                      US federal and state hours by the recipient's state
//	[TENANT/]CHANNEL[.CATEGORY]:max-defer=DURATION          defer at most this long, then expire
//	[TENANT/]CHANNEL[.CATEGORY]:rerun=at-least-once|at-most-once
//	[TENANT/]tz=ZONE                                        default zone for quiet hours
//	[TENANT/]CHANNEL[.CATEGORY]:bulk                        the bulk lane (email: needs a List-Unsubscribe)
//	[TENANT/]email[.CATEGORY]:unsubscribe=TARGET            default List-Unsubscribe ({id} = id)
//	[TENANT/]email[.CATEGORY]:unsubscribe=hosted            Sluice's own one-click unsubscribe link
//	TENANT/shard=K                                          the tenant's queues get shard K to themselves
//	TENANT/weight=N                                         the tenant's share of a lane under contention (default 1)
//	[TENANT/]CHANNEL:providers=A+B                          the channel's providers in the order tried (SLUICE_*_PROVIDERS names)
//	TENANT/sms:inbound=NUMBER|ID…                           the numbers, messaging profiles and Messaging Services whose inbound messages are the tenant's
//	[TENANT/]max-queued=N, max-queued-bytes=N               caps on queued work (queued.go)
//	[TENANT/]CHANNEL.CATEGORY:consent=exempt                goes after an opt-out of every category
//	[TENANT/]CHANNEL:optout=all|category                    what an opt-out covers (default all)
//	[TENANT/]sms:reply-stop|start|help=TEXT                 the reply to a keyword (%2C: a comma)
//	[TENANT/]sms:keywords-stop|start|help=WORD WORD         words besides the standard ones
//
// A rate rule's CHANNEL may be '*' for a user rule: every channel counts in
// one window per person ("*.marketing:user=3/1d"); a notification without a
// user is not counted by user rules.
//
// SCOPE is recipient, tenant, sender, provider or user; WINDOW a Go duration or
// whole days ("1d"), a calendar period of a zone ("1d@America/Los_Angeles":
// m, h, d, w, mo) or a bucketed window ("1h~60"), as throttle.ParseRule reads. Errors wrap ErrBadRules and name the entry.
func Parse(s string) (Policy, error) {
	var p Policy
	n := 0
	for _, line := range strings.Split(s, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		for _, part := range strings.Split(line, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			n++
			e, err := parseEntry(part)
			if err != nil {
				return Policy{}, fmt.Errorf("%w: entry %d %q: %w", ErrBadRules, n, part, err)
			}
			for _, o := range p.entries {
				if o.same(e) {
					return Policy{}, fmt.Errorf("%w: entry %d %q: repeats %q", ErrBadRules, n, part, o.String())
				}
			}
			p.entries = append(p.entries, e)
		}
	}
	if err := p.checkSize(); err != nil {
		return Policy{}, err
	}
	p.index()
	return p, nil
}

// same reports entries that say the same thing about the same target.
func (e Entry) same(o Entry) bool {
	if e.Tenant != o.Tenant || e.Channel != o.Channel || e.Category != o.Category || e.Kind != o.Kind {
		return false
	}
	if e.Kind == KindRate {
		return e.Scope == o.Scope && e.Rule.Same(o.Rule)
	}
	if e.Kind == KindConcurrency {
		return e.Scope == o.Scope
	}
	return e.Reply == o.Reply
}

// checkSize keeps every check within throttle.MaxRules.
func (p Policy) checkSize() error {
	tenants, cats := map[string]bool{"": true}, map[string]bool{"": true, "~other": true}
	for _, e := range p.entries {
		tenants[e.Tenant] = true
		if e.Category != "" {
			cats[e.Category] = true
		}
	}
	for t := range tenants {
		for _, ch := range []tasks.Channel{tasks.Email, tasks.SMS, tasks.WhatsApp} {
			for c := range cats {
				if n := len(p.Match(t, ch, c).Rates); n > throttle.MaxRules {
					return fmt.Errorf("%w: %d rules apply to %s %s %s, at most %d", ErrBadRules, n, t, ch, c, throttle.MaxRules)
				}
			}
		}
	}
	return nil
}

// entryText is an entry as parseEntry cuts it: the word that names its
// kind and the value after '='.
type entryText struct {
	// word names the kind: the whole head of an entry without a channel
	// ("shard", "tz"), else what follows ':' ("quiet", "reply-stop",
	// "sender:concurrency"). Trimmed, without TENANT/.
	word     string
	value    string // after '=', trimmed
	hasValue bool   // the entry has an '='
}

// entryKind is one row of the grammar: the words that name a kind of
// entry, and how an entry of that kind is read.
type entryKind struct {
	// name is the kind's word, or how the error for an unknown word lists
	// the kind ("reply-…"); empty for a kind that error does not list.
	name string
	// match recognises the kind's words where they are not exactly name.
	match func(word string) bool
	// parse completes e, whose tenant (and for a channel's entry, channel
	// and category) parseEntry has set, from the entry's text.
	parse func(e Entry, t entryText) (Entry, error)
}

// matches reports whether word names the kind.
func (k entryKind) matches(word string) bool {
	if k.match != nil {
		return k.match(word)
	}
	return word == k.name
}

// tenantKinds are the entries without a channel, [TENANT/]WORD=VALUE.
var tenantKinds = []entryKind{
	{name: "shard", parse: parseShard},
	{name: "weight", parse: parseWeight},
	{name: "max-queued", parse: parseQueuedCap},
	{name: "max-queued-bytes", parse: parseQueuedCap},
	{name: "tz", parse: parseZone},
}

// channelKinds are the entries of a channel,
// [TENANT/]CHANNEL[.CATEGORY]:WORD[=VALUE]. The first row that matches
// the word reads the entry; the names, in this order, are the words the
// error for an unknown one offers.
var channelKinds = []entryKind{
	{match: func(w string) bool { return strings.HasSuffix(w, ":concurrency") }, parse: parseConcurrency},
	{name: ScopeRecipient, parse: parseRate},
	{name: ScopeTenant, parse: parseRate},
	{name: ScopeSender, parse: parseRate},
	{name: ScopeProvider, parse: parseRate},
	{name: ScopeUser, parse: parseRate},
	{name: "exempt", parse: parseExempt},
	{name: "providers", parse: parseProviders},
	{name: "inbound", parse: parseInbound},
	{name: "digest", parse: parseDigest},
	{name: "quiet", parse: parseQuiet},
	{name: "max-defer", parse: parseMaxDefer},
	{name: "rerun", parse: parseRerun},
	{name: "bulk", parse: parseBulk},
	{name: "unsubscribe", parse: parseUnsubscribe},
	{name: "consent", parse: parseConsentExempt},
	{name: "optout", parse: parseOptOut},
	{name: "reply-…", match: func(w string) bool { return strings.HasPrefix(w, "reply-") }, parse: parseReply},
	{name: "keywords-…", match: func(w string) bool { return strings.HasPrefix(w, "keywords-") }, parse: parseKeywords},
}

// findKind returns the first row of kinds that matches word.
func findKind(kinds []entryKind, word string) (entryKind, bool) {
	for _, k := range kinds {
		if k.matches(word) {
			return k, true
		}
	}
	return entryKind{}, false
}

// kindNames lists the named rows of kinds: "a, b or c".
func kindNames(kinds []entryKind) string {
	var names []string
	for _, k := range kinds {
		if k.name != "" {
			names = append(names, k.name)
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// parseEntry reads one entry of a rule list: its TENANT/, then the row of
// tenantKinds or channelKinds its word names.
func parseEntry(s string) (Entry, error) {
	var e Entry
	head, value, hasValue := strings.Cut(s, "=")
	head = strings.TrimSpace(head)
	if t, rest, ok := strings.Cut(head, "/"); ok {
		if err := tasks.CheckTenant(strings.TrimSpace(t)); err != nil {
			return e, err
		}
		e.Tenant, head = strings.TrimSpace(t), strings.TrimSpace(rest)
	}
	text := entryText{word: head, value: strings.TrimSpace(value), hasValue: hasValue}
	if k, ok := findKind(tenantKinds, head); ok {
		return k.parse(e, text)
	}
	target, word, ok := strings.Cut(head, ":")
	if !ok {
		return e, errors.New("want CHANNEL[.CATEGORY]:SCOPE=LIMIT/WINDOW (or :exempt, :quiet=, :max-defer=, :rerun=)")
	}
	ch, cat, hasCat := strings.Cut(strings.TrimSpace(target), ".")
	e.Channel = tasks.Channel(ch)
	if e.Channel != AnyChannel {
		if _, err := e.Channel.TaskType(); err != nil {
			return e, err
		}
	}
	if hasCat {
		if err := tasks.CheckCategory(cat); err != nil {
			return e, err
		}
		e.Category = cat
	}
	text.word = strings.TrimSpace(word)
	if e.Channel == AnyChannel && text.word != ScopeUser {
		return e, errors.New("'*' (every channel) is for person caps: *[.CATEGORY]:user=LIMIT/WINDOW")
	}
	if k, ok := findKind(channelKinds, text.word); ok {
		return k.parse(e, text)
	}
	return e, fmt.Errorf("%q after ':': want %s", text.word, kindNames(channelKinds))
}

// parseShard reads TENANT/shard=K. In a tenant's plan the entry needs no
// TENANT/; in SLUICE_RULES it does (Policy.CheckDefaults).
func parseShard(e Entry, t entryText) (Entry, error) {
	k, err := strconv.Atoi(t.value)
	if !t.hasValue || err != nil || k < 0 || k >= tasks.MaxShards {
		return e, fmt.Errorf("shard %q: want a shard number from 0 to %d (below SLUICE_QUEUE_SHARDS)", t.value, tasks.MaxShards-1)
	}
	e.Kind, e.Shard = KindShard, k
	return e, nil
}

// parseWeight reads TENANT/weight=N: the tenant's share of each lane's
// dequeues while other tenants have work waiting in it, against a default
// of 1. Like shard=K it needs no TENANT/ in a tenant's plan.
func parseWeight(e Entry, t entryText) (Entry, error) {
	w, err := strconv.Atoi(t.value)
	if !t.hasValue || err != nil || w < 1 || w > MaxWeight {
		return e, fmt.Errorf("weight %q: want a whole number from 1 to %d (the default is 1)", t.value, MaxWeight)
	}
	e.Kind, e.Weight = KindWeight, w
	return e, nil
}

// parseZone reads [TENANT/]tz=ZONE.
func parseZone(e Entry, t entryText) (Entry, error) {
	if !t.hasValue {
		return e, errors.New("want tz=ZONE, e.g. tz=America/New_York")
	}
	if _, err := Zones(t.value, "", nil); err != nil {
		return e, err
	}
	e.Kind, e.Zone = KindZone, t.value
	return e, nil
}

// parseConcurrency reads CHANNEL[.CATEGORY]:SCOPE:concurrency=N.
func parseConcurrency(e Entry, t entryText) (Entry, error) {
	scope := strings.TrimSuffix(t.word, ":concurrency")
	switch scope {
	case ScopeRecipient, ScopeTenant, ScopeSender, ScopeProvider:
	default:
		return e, fmt.Errorf("%q: want recipient, tenant, sender or provider before :concurrency", scope)
	}
	if e.Tenant != "" && scope == ScopeProvider {
		return e, errors.New("a provider cap counts every tenant's sends: it cannot belong to one tenant")
	}
	n, err := strconv.Atoi(t.value)
	if !t.hasValue || err != nil || n < 1 || n > throttle.MaxLimit {
		return e, fmt.Errorf("concurrency %q: want a whole number of sends in flight from 1 to %d", t.value, throttle.MaxLimit)
	}
	e.Kind, e.Scope, e.Max = KindConcurrency, scope, n
	return e, nil
}

// parseRate reads CHANNEL[.CATEGORY]:SCOPE=LIMIT/WINDOW [defer|drop].
func parseRate(e Entry, t entryText) (Entry, error) {
	if !t.hasValue {
		return e, fmt.Errorf("want %s=LIMIT/WINDOW", t.word)
	}
	if e.Tenant != "" && t.word == ScopeProvider {
		return e, errors.New("a provider rule counts every tenant's sends: it cannot belong to one tenant")
	}
	if t.word == ScopeUser && t.value == "required" {
		e.Kind = KindRequireUser
		return e, nil
	}
	e.Kind, e.Scope = KindRate, t.word
	rule, action, _ := strings.Cut(t.value, " ")
	r, err := throttle.ParseRule(rule)
	if err != nil {
		return e, err
	}
	e.Rule = r
	if r.Distinct && (e.Scope == ScopeRecipient || e.Scope == ScopeUser) {
		return e, fmt.Errorf("%s=%s counts distinct recipients of a tenant, sender or provider: a %s has one", e.Scope, rule, e.Scope)
	}
	switch strings.TrimSpace(action) {
	case "", "defer":
	case "drop":
		e.Drop = true
	default:
		return e, fmt.Errorf("action %q: want defer (the default) or drop", strings.TrimSpace(action))
	}
	return e, nil
}

// parseExempt reads CHANNEL.CATEGORY:exempt.
func parseExempt(e Entry, t entryText) (Entry, error) {
	if t.hasValue {
		return e, errors.New("exempt takes no value")
	}
	if e.Category == "" {
		return e, errors.New("exempt needs a category (e.g. sms.otp:exempt): it exempts that category from the channel's other rules")
	}
	e.Kind = KindExempt
	return e, nil
}

// parseProviders reads [TENANT/]CHANNEL:providers=A+B: the names of the
// channel's providers (SLUICE_SMS_PROVIDERS) its sends use, in the order
// they are tried, instead of the deployment's list.
func parseProviders(e Entry, t entryText) (Entry, error) {
	if e.Category != "" {
		return e, errors.New("providers applies to a whole channel (e.g. sms:providers=backup+default), not a category")
	}
	if !t.hasValue || t.value == "" {
		return e, errors.New("want providers=NAME+NAME…, the names of SLUICE_SMS_PROVIDERS or SLUICE_EMAIL_PROVIDERS in the order to try them")
	}
	seen := map[string]bool{}
	for _, name := range strings.Split(t.value, "+") {
		name = strings.TrimSpace(name)
		if !ValidProviderName(name) || seen[name] {
			return e, fmt.Errorf("providers %q: want distinct names of a lower-case letter then letters and digits (at most 16), joined by +", t.value)
		}
		seen[name] = true
		e.Providers = append(e.Providers, name)
	}
	e.Kind = KindProviders
	return e, nil
}

// ValidProviderName reports whether s can name a provider: 1 to 16
// lowercase letters and digits, starting with a letter. Plans'
// CHANNEL:providers= lists and the deployment's SLUICE_*_PROVIDERS share it.
func ValidProviderName(s string) bool {
	if len(s) == 0 || len(s) > 16 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// Providers returns the provider names tenant's sends on ch use, in order
// (its plan's CHANNEL:providers=..., else the deployment rules' one); nil:
// the deployment's list (SLUICE_*_PROVIDERS). The slice is shared.
func (p Policy) Providers(tenant string, ch tasks.Channel) []string {
	if l, ok := p.providers[tenant+"/"+string(ch)]; ok {
		return l
	}
	return p.providers["/"+string(ch)]
}

// parseQuiet reads CHANNEL[.CATEGORY]:quiet=HH:MM-HH:MM, or a preset.
func parseQuiet(e Entry, t entryText) (Entry, error) {
	q, err := ParseQuietHours(t.value)
	if err != nil {
		return e, err
	}
	if q.Preset != "" && e.Channel != tasks.SMS {
		return e, fmt.Errorf("quiet=%s reads the recipient's state from a phone number: it is for sms (give %s quiet=HH:MM-HH:MM)", q, e.Channel)
	}
	e.Kind, e.Quiet = KindQuiet, q
	return e, nil
}

// parseMaxDefer reads CHANNEL[.CATEGORY]:max-defer=DURATION.
func parseMaxDefer(e Entry, t entryText) (Entry, error) {
	d, err := parseDuration(t.value)
	if err != nil || d < time.Second || d > throttle.MaxWindow {
		return e, fmt.Errorf("max-defer %q: want a duration from 1s to %s (e.g. 6h, 2d)", t.value, throttle.FormatWindow(throttle.MaxWindow))
	}
	e.Kind, e.MaxDefer = KindMaxDefer, d
	return e, nil
}

// parseRerun reads CHANNEL[.CATEGORY]:rerun=at-least-once|at-most-once.
func parseRerun(e Entry, t entryText) (Entry, error) {
	if t.value != AtLeastOnce && t.value != AtMostOnce {
		return e, fmt.Errorf("rerun %q: want %s or %s", t.value, AtLeastOnce, AtMostOnce)
	}
	e.Kind, e.Rerun = KindRerun, t.value
	return e, nil
}

// parseBulk reads CHANNEL[.CATEGORY]:bulk.
func parseBulk(e Entry, t entryText) (Entry, error) {
	if t.hasValue {
		return e, errors.New("bulk takes no value")
	}
	e.Kind = KindBulk
	return e, nil
}

// parseUnsubscribe reads email[.CATEGORY]:unsubscribe=TARGET (or =hosted).
func parseUnsubscribe(e Entry, t entryText) (Entry, error) {
	if e.Channel != tasks.Email {
		return e, fmt.Errorf("%s is for email (List-Unsubscribe)", t.word)
	}
	if t.value != HostedUnsubscribe {
		if _, err := tasks.ParseListUnsubscribe(strings.ReplaceAll(t.value, "{id}", "x")); err != nil {
			return e, err
		}
	}
	e.Kind, e.Target = KindUnsubscribe, t.value
	return e, nil
}

func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		if _, err := fmt.Sscanf(days, "%d", &n); err != nil || fmt.Sprint(n) != days {
			return 0, fmt.Errorf("bad days %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

// CheckDefaults reports entries that only a tenant can have, written
// without one in the deployment's rules (SLUICE_RULES): shard=K, weight=N.
func (p Policy) CheckDefaults() error {
	for _, e := range p.entries {
		if e.Kind == KindShard && e.Tenant == "" {
			return fmt.Errorf("%w: %q pins one tenant's queues: write it as TENANT/shard=K (or put shard=K in the tenant's plan)", ErrBadRules, e.String())
		}
		if e.Kind == KindWeight && e.Tenant == "" {
			return fmt.Errorf("%w: %q weighs one tenant: write it as TENANT/weight=N (or put weight=N in the tenant's plan)", ErrBadRules, e.String())
		}
		if e.Kind == KindInbound && e.Tenant == "" {
			return fmt.Errorf("%w: %q names one tenant's numbers: write it as TENANT/sms:inbound=… (or put sms:inbound=… in the tenant's plan)", ErrBadRules, e.String())
		}
	}
	return nil
}

// MaxInbound bounds the numbers and ids of one sms:inbound entry.
const MaxInbound = 256

// parseInbound reads [TENANT/]sms:inbound=NUMBER|ID…: the tenant's own
// numbers (E.164) and messaging profiles (a Telnyx messaging profile id, a
// Twilio Messaging Service SID) — an inbound message (a STOP, a reply) is
// applied to a tenant only when it was sent to one of them.
func parseInbound(e Entry, t entryText) (Entry, error) {
	if e.Channel != tasks.SMS || e.Category != "" {
		return e, errors.New("inbound is sms:inbound=NUMBER|ID…, for the whole channel")
	}
	if !t.hasValue || t.value == "" {
		return e, errors.New("want sms:inbound=NUMBER|ID…: the tenant's E.164 numbers and messaging profile ids or Messaging Service SIDs, joined by |")
	}
	for _, v := range strings.Split(t.value, "|") {
		v = strings.TrimSpace(v)
		switch {
		case strings.HasPrefix(v, "+"):
			if n := tasks.NormalizePhone(v); tasks.IsE164(n) {
				v = n
			} else {
				return e, fmt.Errorf("inbound %q: not an E.164 number", v)
			}
		case len(v) < 2 || len(v) > 64 || strings.ContainsFunc(v, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
		}):
			return e, fmt.Errorf("inbound %q: want an E.164 number or an id of letters, digits, - and _ (2-64)", v)
		}
		if !slices.Contains(e.Inbound, v) {
			e.Inbound = append(e.Inbound, v)
		}
	}
	if len(e.Inbound) > MaxInbound {
		return e, fmt.Errorf("inbound: %d numbers and ids, at most %d", len(e.Inbound), MaxInbound)
	}
	e.Kind = KindInbound
	return e, nil
}

// OwnsInbound reports whether tenant's sms:inbound entries name to (an
// E.164 number, normalised) or profile (a messaging profile id or
// Messaging Service SID): whether an inbound message sent there is the
// tenant's. A tenant that names none owns none.
func (p Policy) OwnsInbound(tenant, to, profile string) bool {
	if n := tasks.NormalizePhone(to); n != "" && slices.Contains(p.inbound[n], tenant) {
		return true
	}
	return profile != "" && slices.Contains(p.inbound[profile], tenant)
}

// Weights are the tenants whose share of a lane is not the default 1
// (TENANT/weight=N). The map is shared: do not change it.
func (p Policy) Weights() map[string]int { return p.weights }

// Pins are the tenants the rules give shards of their own (TENANT/shard=K).
// The map is shared: do not change it.
func (p Policy) Pins() tasks.Pins { return p.pins }

// Lane is the lane of a tenant's notifications of a channel and category:
// priority when the category is exempt, bulk when it is marked bulk,
// standard otherwise.
func (m Match) Lane() tasks.Lane {
	switch {
	case m.Exempt:
		return tasks.LanePriority
	case m.Bulk:
		return tasks.LaneBulk
	}
	return tasks.LaneStandard
}

// Queue is the queue of n under the policy in layout l: its lane's shard
// for its tenant. Producers that know the rules route with it; workers
// move a task found elsewhere.
func (p Policy) Queue(l tasks.Layout, n tasks.Notification) string {
	return l.Route(n.Tenant, p.Match(n.Tenant, n.Channel, n.Category).Lane(), p.pins)
}

// Entries returns every entry, in the order given.
func (p Policy) Entries() []Entry { return slices.Clone(p.entries) }

// String prints the policy in the grammar, comma-separated.
func (p Policy) String() string {
	parts := make([]string, len(p.entries))
	for i, e := range p.entries {
		parts[i] = e.String()
	}
	return strings.Join(parts, ",")
}

// With returns the policy with a tenant's entries replaced by those of
// tenantRules (every entry of which must name no tenant or this one).
func (p Policy) With(tenant string, tenantRules Policy) (Policy, error) {
	var out Policy
	for _, e := range p.entries {
		if e.Tenant != tenant {
			out.entries = append(out.entries, e)
		}
	}
	for _, e := range tenantRules.entries {
		if e.Tenant != "" && e.Tenant != tenant {
			return Policy{}, fmt.Errorf("%w: %q belongs to tenant %s, not %s", ErrBadRules, e.String(), e.Tenant, tenant)
		}
		if e.Kind == KindRate && e.Scope == ScopeProvider {
			return Policy{}, fmt.Errorf("%w: %q: a tenant's plan cannot hold a provider rule", ErrBadRules, e.String())
		}
		e.Tenant = tenant
		out.entries = append(out.entries, e)
	}
	if err := out.checkSize(); err != nil {
		return Policy{}, err
	}
	out.index()
	return out, nil
}

// Match is what applies to one tenant's notifications of a channel and category.
type Match struct {
	// Rates are the rate rules, each counted in its own windows.
	Rates []Entry
	// Exempt: the category is a priority lane, outside the channel's
	// category-less rules (rates, quiet hours, max-defer).
	Exempt bool
	// Quiet hours in the recipient's local time; nil when none.
	Quiet *QuietHours
	// MaxDefer bounds how long a send may be deferred in all; 0: no bound.
	MaxDefer time.Duration
	// Rerun is the policy for a re-run with an unknown outcome; "" means the default.
	Rerun string
	// Zone is the tenant's default zone for quiet hours; "" means the deployment's.
	Zone string
	// Bulk: the category waits in the bulk lane; bulk mail must also carry
	// a List-Unsubscribe.
	Bulk bool
	// Unsubscribe is the default List-Unsubscribe target ({id}: the
	// notification id) for emails that name none; "" when none.
	Unsubscribe string
	// Caps are the in-flight caps (KindConcurrency), a tenant's replacing the
	// default of the same channel, category and scope.
	Caps []Entry
	// Digest folds sends its rules defer into one message per slot; nil
	// when the category is not digested.
	Digest *Digest
	// RequireUser: a notification must name its person (user), or it is
	// refused (user=required).
	RequireUser bool
}

// Match returns what applies to a tenant's notifications on ch of category
// (empty: tasks.DefaultCategory). A tenant's entry replaces the default one
// with the same target (rates: same channel, category, scope and window);
// for quiet hours, max-defer and rerun the most specific entry wins:
// tenant and category, then category, then tenant, then the channel.
func (p Policy) Match(tenant string, ch tasks.Channel, category string) Match {
	if category == "" {
		category = tasks.DefaultCategory
	}
	var m Match
	// Sluice's own replies to keywords answer the recipient's message: the
	// priority lane, outside the channel's category-less rules (one per
	// keyword within minutes, see ReplyCategory).
	m.Exempt = category == ReplyCategory
	for _, e := range p.entries {
		if e.Kind == KindExempt && e.Channel == ch && e.Category == category && (e.Tenant == "" || e.Tenant == tenant) {
			m.Exempt = true
		}
		if e.Kind == KindZone && (e.Tenant == tenant || e.Tenant == "" && m.Zone == "") {
			m.Zone = e.Zone
		}
	}
	applies := func(e Entry) bool {
		return (e.Channel == ch || e.Channel == AnyChannel) && (e.Category == category || e.Category == "" && !m.Exempt)
	}
	m.Caps = p.caps(tenant, applies)
	m.Rates = p.rates(tenant, applies)
	best := func(kind Kind) (Entry, bool) { return p.best(kind, tenant, applies) }
	if e, ok := best(KindQuiet); ok {
		q := e.Quiet
		m.Quiet = &q
	}
	if e, ok := best(KindMaxDefer); ok {
		m.MaxDefer = e.MaxDefer
	}
	if e, ok := best(KindRerun); ok {
		m.Rerun = e.Rerun
	}
	if _, ok := best(KindBulk); ok {
		m.Bulk = true
	}
	if e, ok := best(KindUnsubscribe); ok {
		m.Unsubscribe = e.Target
	}
	if e, ok := best(KindDigest); ok && !m.Exempt {
		m.Digest = e.Digest
	}
	if _, ok := best(KindRequireUser); ok {
		m.RequireUser = true
	}
	return m
}

// caps are the concurrency entries that apply to tenant, a tenant's
// replacing the default of the same channel, category and scope.
func (p Policy) caps(tenant string, applies func(Entry) bool) []Entry {
	var caps []Entry
	for _, e := range p.entries {
		if e.Kind != KindConcurrency || !applies(e) || e.Tenant != "" && e.Tenant != tenant {
			continue
		}
		if e.Tenant == "" && tenant != "" && slices.ContainsFunc(p.entries, func(o Entry) bool {
			return o.Tenant == tenant && o.Kind == KindConcurrency && o.Channel == e.Channel && o.Category == e.Category && o.Scope == e.Scope
		}) {
			continue
		}
		caps = append(caps, e)
	}
	return caps
}

// rates are the rate entries that apply to tenant, a tenant's replacing
// the default of the same channel, category, scope and window.
func (p Policy) rates(tenant string, applies func(Entry) bool) []Entry {
	var rates []Entry
	for _, e := range p.entries {
		if e.Kind != KindRate || !applies(e) {
			continue
		}
		if e.Tenant == "" {
			replaced := tenant != "" && slices.ContainsFunc(p.entries, func(o Entry) bool {
				return o.Tenant == tenant && o.Kind == KindRate && o.Channel == e.Channel && o.Category == e.Category &&
					o.Scope == e.Scope && o.Rule.Same(e.Rule)
			})
			if !replaced {
				rates = append(rates, e)
			}
		} else if e.Tenant == tenant {
			rates = append(rates, e)
		}
	}
	return rates
}

// best is the most specific entry of kind that applies to tenant: tenant
// and category, then category, then tenant, then the channel; the first
// of equals. ok is false when none applies.
func (p Policy) best(kind Kind, tenant string, applies func(Entry) bool) (found Entry, ok bool) {
	rank := -1
	for _, e := range p.entries {
		if e.Kind != kind || !applies(e) || (e.Tenant != "" && e.Tenant != tenant) {
			continue
		}
		r := 0
		if e.Category != "" {
			r += 2
		}
		if e.Tenant != "" {
			r++
		}
		if r > rank {
			rank, found = r, e
		}
	}
	return found, rank >= 0
}

// Cap returns a concurrency entry as the limiter's in-flight cap for a
// notification to recipient from origin from.
func (e Entry) Cap(recipient, from string) throttle.Cap {
	c := throttle.Cap{Scope: e.LimitScope(), Max: e.Max}
	switch e.Scope {
	case ScopeRecipient:
		c.Subject = recipient
	case ScopeSender:
		c.Subject, c.Group = from, SharedGroup
	case ScopeProvider:
		c.Group = SharedGroup
	}
	return c
}

// Limit binds a rate entry to a notification: its recipient for recipient
// rules, its sender (from) for sender rules, its user (the person) for user
// rules. Sender and provider windows are shared by every tenant: they live
// in their own limiter group. A user rule's window is the tenant's, like a
// recipient's, and one for every channel it names ("*": the same scope,
// so the same window, whatever the notification's channel).
func (e Entry) Limit(recipient, from, user string) throttle.Limit {
	l := throttle.Limit{Scope: e.LimitScope(), Rule: e.Rule, Drop: e.Drop}
	if e.Rule.Distinct {
		l.Distinct = recipient // the rule counts distinct recipients of its scope
	}
	switch e.Scope {
	case ScopeUser:
		l.Subject = user
	case ScopeRecipient:
		l.Subject = recipient
	case ScopeSender:
		l.Subject, l.Group = from, SharedGroup
	case ScopeProvider:
		l.Group = SharedGroup
	}
	return l
}

// SharedGroup is the limiter group of the windows every tenant shares
// (sender and provider rules).
const SharedGroup = "~shared"
