package plans_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

func rates(m plans.Match) []string {
	var out []string
	for _, e := range m.Rates {
		out = append(out, e.String())
	}
	return out
}

// The three setups the README shows read as written and apply as meant.
func TestParseCommonSetups(t *testing.T) {
	t.Parallel()
	// (a) OTP is a priority lane: no marketing or channel cap delays it, but
	// it has its own anti-abuse cap.
	a, err := plans.Parse(`
		sms:recipient=1/1m, sms:recipient=5/1d   # every category but the exempt ones
		sms.marketing:recipient=3/1d
		sms.otp:exempt
		sms.otp:recipient=10/1h`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rates(a.Match("acme", tasks.SMS, "otp")), []string{"sms.otp:recipient=10/1h"}; !slices.Equal(got, want) {
		t.Errorf("(a) otp: %v, want %v", got, want)
	}
	if got, want := rates(a.Match("acme", tasks.SMS, "marketing")), []string{"sms:recipient=1/1m", "sms:recipient=5/1d", "sms.marketing:recipient=3/1d"}; !slices.Equal(got, want) {
		t.Errorf("(a) marketing: %v, want %v", got, want)
	}
	if !a.Match("acme", tasks.SMS, "otp").Exempt || a.Match("acme", tasks.SMS, "").Exempt {
		t.Error("(a) exempt flags")
	}
	// (b) marketing 3/day and 1/min per number, dropped over the cap; tenant 1000/h.
	b, err := plans.Parse("sms.marketing:recipient=3/1d drop,sms.marketing:recipient=1/1m,sms:tenant=1000/1h,sms.marketing:quiet=21:00-08:00,sms.marketing:max-defer=6h")
	if err != nil {
		t.Fatal(err)
	}
	mb := b.Match("acme", tasks.SMS, "marketing")
	if got, want := rates(mb), []string{"sms.marketing:recipient=3/1d drop", "sms.marketing:recipient=1/1m", "sms:tenant=1000/1h"}; !slices.Equal(got, want) {
		t.Errorf("(b) marketing: %v, want %v", got, want)
	}
	if mb.Quiet == nil || mb.Quiet.String() != "21:00-08:00" || mb.MaxDefer != 6*time.Hour || !mb.Rates[0].Drop {
		t.Errorf("(b) quiet %v, max-defer %v, drop %v", mb.Quiet, mb.MaxDefer, mb.Rates[0].Drop)
	}
	if got, want := rates(b.Match("acme", tasks.SMS, "")), []string{"sms:tenant=1000/1h"}; !slices.Equal(got, want) || b.Match("acme", tasks.SMS, "").Quiet != nil {
		t.Errorf("(b) default category: %v, want %v and no quiet hours", got, want)
	}
	// (c) transactional email has its own tenant bucket, outside the shared one.
	c, err := plans.Parse("email:tenant=10000/1h,email.transactional:exempt,email.transactional:tenant=50000/1h,email.transactional:recipient=20/1h")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rates(c.Match("acme", tasks.Email, "transactional")), []string{"email.transactional:tenant=50000/1h", "email.transactional:recipient=20/1h"}; !slices.Equal(got, want) {
		t.Errorf("(c) transactional: %v, want %v", got, want)
	}
	if got := c.Match("acme", tasks.Email, "transactional").Rates[0].LimitScope(); got != "email.transactional:tenant" {
		t.Errorf("(c) its own windows: scope %q", got)
	}
}

// A tenant's entries replace the defaults of the same target; the most
// specific quiet hours, max-defer and rerun win; exempt categories skip the
// channel's category-less entries of every kind.
func TestMatchPrecedence(t *testing.T) {
	t.Parallel()
	p, err := plans.Parse(`sms:recipient=1/1m,sms:recipient=5/1d,sms:tenant=1000/1h
		acme/sms:tenant=5000/1h,acme/sms:recipient=2/1h
		sms:quiet=21:00-08:00, sms.promo:quiet=20:00-09:00, acme/sms:quiet=22:00-07:00
		sms:rerun=at-most-once, sms.otp:exempt, sms.otp:rerun=at-least-once
		sms:sender=1/1s, sms:provider=75/1s
		tz=Europe/London, acme/tz=America/New_York`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rates(p.Match("other", tasks.SMS, "")), []string{"sms:recipient=1/1m", "sms:recipient=5/1d", "sms:tenant=1000/1h", "sms:sender=1/1s", "sms:provider=75/1s"}; !slices.Equal(got, want) {
		t.Errorf("other: %v, want %v", got, want)
	}
	if got, want := rates(p.Match("acme", tasks.SMS, "")), []string{"sms:recipient=1/1m", "sms:recipient=5/1d", "acme/sms:tenant=5000/1h", "acme/sms:recipient=2/1h", "sms:sender=1/1s", "sms:provider=75/1s"}; !slices.Equal(got, want) {
		t.Errorf("acme: %v, want %v", got, want)
	}
	for _, tc := range []struct {
		tenant, category, quiet, rerun, zone string
	}{
		{"other", "", "21:00-08:00", "at-most-once", "Europe/London"},
		{"acme", "", "22:00-07:00", "at-most-once", "America/New_York"},
		{"acme", "promo", "20:00-09:00", "at-most-once", "America/New_York"},
		{"acme", "otp", "", "at-least-once", "America/New_York"},
	} {
		m := p.Match(tc.tenant, tasks.SMS, tc.category)
		quiet := ""
		if m.Quiet != nil {
			quiet = m.Quiet.String()
		}
		if quiet != tc.quiet || m.Rerun != tc.rerun || m.Zone != tc.zone {
			t.Errorf("%s/%s: quiet %q rerun %q zone %q; want %q %q %q", tc.tenant, tc.category, quiet, m.Rerun, m.Zone, tc.quiet, tc.rerun, tc.zone)
		}
	}
	if n := len(p.Match("acme", tasks.SMS, "otp").Rates); n != 0 {
		t.Errorf("otp (exempt, no own rates): %d rates", n)
	}
	// Sender and provider windows are shared by every tenant.
	m := p.Match("acme", tasks.SMS, "")
	for _, e := range m.Rates {
		l := e.Limit("+14155550100", "+15005550006", "")
		switch e.Scope {
		case plans.ScopeSender:
			if l.Group != plans.SharedGroup || l.Subject != "+15005550006" {
				t.Errorf("sender limit %+v", l)
			}
		case plans.ScopeProvider:
			if l.Group != plans.SharedGroup || l.Subject != "" {
				t.Errorf("provider limit %+v", l)
			}
		case plans.ScopeRecipient:
			if l.Group != "" || l.Subject != "+14155550100" {
				t.Errorf("recipient limit %+v", l)
			}
		}
	}
	// A tenant's plan replaces its entries, keeps everyone else's.
	acme, err := plans.Parse("sms:tenant=7/1h,sms.marketing:exempt")
	if err != nil {
		t.Fatal(err)
	}
	q, err := p.With("acme", acme)
	if err != nil {
		t.Fatal(err)
	}
	if got := rates(q.Match("acme", tasks.SMS, "")); !slices.Contains(got, "acme/sms:tenant=7/1h") || slices.Contains(got, "acme/sms:tenant=5000/1h") {
		t.Errorf("after With: %v", got)
	}
	if _, err := p.With("acme", mustParse(t, "beta/sms:tenant=1/1h")); !errors.Is(err, plans.ErrBadRules) {
		t.Errorf("another tenant's entry in acme's plan: %v", err)
	}
	if _, err := p.With("acme", mustParse(t, "sms:provider=1/1s")); !errors.Is(err, plans.ErrBadRules) {
		t.Errorf("a provider rule in a tenant's plan: %v", err)
	}
}

func mustParse(t *testing.T, s string) plans.Policy {
	t.Helper()
	p, err := plans.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseErrorsNameTheEntry(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{
		"sms:recipient":                         `entry 1 "sms:recipient": want recipient=LIMIT/WINDOW`,
		"sms=1/1m":                              `entry 1 "sms=1/1m": want CHANNEL[.CATEGORY]:SCOPE`,
		"fax:recipient=1/1m":                    `unknown channel "fax"`,
		"sms:planet=1/1m":                       `"planet" after ':'`,
		"sms:recipient=0/1m":                    `limit 0 must be between 1 and`,
		"sms:recipient=1/1m,sms:recipient=2/1m": `entry 2 "sms:recipient=2/1m": repeats "sms:recipient=1/1m"`,
		"a b/sms:tenant=1/1m":                   `tenant "a b"`,
		"sms:recipient=1/xyz":                   `window "xyz"`,
		"sms.Bad:recipient=1/1m":                `category "Bad"`,
		"sms:exempt":                            "exempt needs a category",
		"sms.otp:exempt=yes":                    "exempt takes no value",
		"sms:quiet=25:00-08:00":                 `hour 25`,
		"sms:max-defer=soon":                    `max-defer "soon"`,
		"sms:rerun=twice":                       `rerun "twice"`,
		"sms:recipient=1/1m later":              `action "later"`,
		"acme/sms:provider=1/1s":                "cannot belong to one tenant",
		"tz=Mars/Olympus":                       "Mars/Olympus",
		"email:tenant=1/1m,\n  sms:tenant=1/1q": `entry 2 "sms:tenant=1/1q"`,
	} {
		_, err := plans.Parse(s)
		if !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want ErrBadRules mentioning %q", s, err, want)
		}
	}
	var many []string
	for i := 1; i <= 17; i++ {
		many = append(many, "sms:recipient=1/"+(time.Duration(i)*time.Second).String())
	}
	if _, err := plans.Parse(strings.Join(many, ",")); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), "at most 16") {
		t.Errorf("17 rules on one channel: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("sms:recipient=1/1m,sms:recipient=5/1d,acme/sms:tenant=5000/1h")
	f.Add("sms.otp:exempt\nsms.otp:recipient=10/1h # anti-abuse\nsms.marketing:quiet=21-8")
	f.Add("email:tenant=1/1ms,,")
	f.Add("a/b/c:d=1/1m")
	f.Add("sms:sender=1/1s drop,sms:max-defer=2d,tz=UTC,sms:rerun=at-most-once")
	f.Add("sms.marketing:quiet=tcpa,acme/sms:quiet=TCPA,email:quiet=tcpa")
	f.Add("sms.otp:consent=exempt,sms:optout=category,acme/sms:reply-stop=You are out%2C bye %25,sms:keywords-stop=BASTA ALTO,email.news:unsubscribe=hosted")
	f.Add("sms:sender=2000/1d@America/Los_Angeles,sms:tenant=10000/1h~60 drop,sms:provider:concurrency=100,acme/sms:sender:concurrency=2,email:tenant=5/1mo")
	f.Add("acme/sms:inbound=+1 415 555 0100|MG0123|tx-profile_1,beta/sms:inbound=+14155550101,sms:inbound=+1")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := plans.Parse(s)
		if err != nil {
			if !errors.Is(err, plans.ErrBadRules) {
				t.Fatalf("error %v without ErrBadRules", err)
			}
			return
		}
		// What parses prints back to the same policy.
		q, err := plans.Parse(p.String())
		if err != nil || q.String() != p.String() {
			t.Fatalf("reprint %q: %v (%q)", p.String(), err, q.String())
		}
	})
}

// Bulk mail needs a List-Unsubscribe; a tenant can give a default one.
func TestBulkAndUnsubscribe(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "email.marketing:bulk,acme/email.marketing:unsubscribe=https://acme.example/u/{id}")
	if m := p.Match("acme", tasks.Email, "marketing"); !m.Bulk || m.Unsubscribe != "https://acme.example/u/{id}" {
		t.Fatalf("acme marketing: %+v", m)
	}
	if m := p.Match("beta", tasks.Email, "marketing"); !m.Bulk || m.Unsubscribe != "" {
		t.Fatalf("beta marketing: %+v", m)
	}
	if m := p.Match("acme", tasks.Email, ""); m.Bulk {
		t.Fatal("the default category is not bulk")
	}
	for s, want := range map[string]string{
		"sms.marketing:unsubscribe=https://x.example/u": "is for email",
		"email:unsubscribe=http://x.example/u":          "https",
		"email.marketing:bulk=yes":                      "bulk takes no value",
	} {
		if _, err := plans.Parse(s); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want %q", s, err, want)
		}
	}
}

// Names knows the categories a policy's entries name, after Parse and With.
func TestNames(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "sms:recipient=1/1m,sms.otp:exempt")
	if !p.Names("otp") || p.Names("marketing") || p.Names("") {
		t.Fatalf("after Parse: otp %v marketing %v", p.Names("otp"), p.Names("marketing"))
	}
	q, err := p.With("acme", mustParse(t, "email.receipts:tenant=5/1h"))
	if err != nil {
		t.Fatal(err)
	}
	if !q.Names("receipts") || !q.Names("otp") {
		t.Fatal("after With: the tenant's and the default categories")
	}
	if (plans.Policy{}).Names("otp") {
		t.Fatal("the zero policy names nothing")
	}
}

// Lanes follow the rules: exempt categories are priority, bulk ones bulk;
// a tenant's shard=K gives it a shard of its own.
func TestLanesAndPins(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "sms.otp:exempt, sms.marketing:bulk, email.news:bulk, acme/shard=3, sms:recipient=1/1m")
	for _, tc := range []struct {
		tenant string
		ch     tasks.Channel
		cat    string
		want   tasks.Lane
	}{
		{"acme", tasks.SMS, "otp", tasks.LanePriority},
		{"acme", tasks.SMS, "marketing", tasks.LaneBulk},
		{"beta", tasks.Email, "news", tasks.LaneBulk},
		{"beta", tasks.Email, "otp", tasks.LaneStandard}, // exempt on sms only
		{"beta", tasks.SMS, "", tasks.LaneStandard},
	} {
		if got := p.Match(tc.tenant, tc.ch, tc.cat).Lane(); got != tc.want {
			t.Errorf("%s %s %q: lane %s, want %s", tc.tenant, tc.ch, tc.cat, got, tc.want)
		}
	}
	if pins := p.Pins(); len(pins) != 1 || pins["acme"] != 3 {
		t.Fatalf("Pins = %v", pins)
	}
	l := tasks.Layout{Shards: 8}
	otp := tasks.NewSMS("acme", "+14155550100", "code")
	otp.Category = "otp"
	if got := p.Queue(l, otp); got != l.Queue(tasks.LanePriority, 3) {
		t.Fatalf("acme's otp queue %q", got)
	}
	if got := p.Queue(l, tasks.NewSMS("beta", "+14155550100", "hi")); got == l.Queue(tasks.LaneStandard, 3) {
		t.Fatal("another tenant routed to acme's pinned shard")
	}
	// A tenant's plan writes shard=K without the tenant; With binds it.
	q, err := p.With("beta", mustParse(t, "shard=5"))
	if err != nil {
		t.Fatal(err)
	}
	if pins := q.Pins(); pins["beta"] != 5 || pins["acme"] != 3 {
		t.Fatalf("after With: %v", q.Pins())
	}
	if err := p.CheckDefaults(); err != nil {
		t.Fatal(err)
	}
	if err := mustParse(t, "shard=2").CheckDefaults(); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), "TENANT/shard=K") {
		t.Fatalf("tenant-less shard in the defaults: %v", err)
	}
	for s, want := range map[string]string{
		"acme/shard=64": "shard number", "acme/shard=-1": "shard number", "acme/shard": "shard number", "acme/shard=x": "shard number",
	} {
		if _, err := plans.Parse(s); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want %q", s, err, want)
		}
	}
	if got := mustParse(t, "acme/shard=7").String(); got != "acme/shard=7" {
		t.Fatalf("String = %q", got)
	}
}

// Calendar and bucketed rules read as rate rules; a calendar day and a
// sliding day of one scope are different rules, and a tenant's calendar rule
// replaces only the default calendar rule of its period and zone.
func TestParseCounterRates(t *testing.T) {
	t.Parallel()
	p, err := plans.Parse(`
		sms:sender=2000/1d@America/Los_Angeles
		sms:sender=100/1d
		sms:tenant=10000/1h~60 drop
		acme/sms:sender=500/1d@America/Los_Angeles`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rates(p.Match("other", tasks.SMS, "")), []string{"sms:sender=2000/1d@America/Los_Angeles", "sms:sender=100/1d", "sms:tenant=10000/1h~60 drop"}; !slices.Equal(got, want) {
		t.Errorf("default: %v, want %v", got, want)
	}
	if got, want := rates(p.Match("acme", tasks.SMS, "")), []string{"sms:sender=100/1d", "sms:tenant=10000/1h~60 drop", "acme/sms:sender=500/1d@America/Los_Angeles"}; !slices.Equal(got, want) {
		t.Errorf("acme: %v, want %v", got, want)
	}
	if _, err := plans.Parse("sms:sender=1/1d@Mars/Olympus"); !errors.Is(err, plans.ErrBadRules) {
		t.Errorf("bad zone: %v", err)
	}
	if _, err := plans.Parse("sms:sender=1/1d@UTC, sms:sender=2/1d@UTC"); !errors.Is(err, plans.ErrBadRules) {
		t.Errorf("repeated calendar rule: %v", err)
	}
}

// In-flight caps read per scope; a tenant's replaces the default of its scope.
func TestParseConcurrency(t *testing.T) {
	t.Parallel()
	p, err := plans.Parse("sms:provider:concurrency=100, sms:sender:concurrency=5, acme/sms:sender:concurrency=2")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range p.Match("acme", tasks.SMS, "").Caps {
		got = append(got, e.String())
	}
	if want := []string{"sms:provider:concurrency=100", "acme/sms:sender:concurrency=2"}; !slices.Equal(got, want) {
		t.Errorf("acme caps %v, want %v", got, want)
	}
	c := p.Match("other", tasks.SMS, "").Caps[1].Cap("+14155550100", "+15005550006")
	if c.Scope != "sms:sender" || c.Subject != "+15005550006" || c.Group != plans.SharedGroup || c.Max != 5 {
		t.Errorf("cap %+v", c)
	}
	for _, bad := range []string{"sms:provider:concurrency=0", "sms:provider:concurrency", "sms:carrier:concurrency=3", "acme/sms:provider:concurrency=3", "sms:provider:concurrency=1, sms:provider:concurrency=2"} {
		if _, err := plans.Parse(bad); !errors.Is(err, plans.ErrBadRules) {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
}

// weight=N gives a tenant its share of a lane under contention: read in
// SLUICE_RULES with TENANT/ (never without) and in a tenant's plan, 1 to
// MaxWeight, printed back as written.
func TestWeight(t *testing.T) {
	p, err := plans.Parse("acme/weight=4,sms:recipient=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	if w := p.Weights(); len(w) != 1 || w["acme"] != 4 {
		t.Fatalf("weights %v, want acme 4", w)
	}
	if s := p.String(); s != "acme/weight=4,sms:recipient=1/1m" {
		t.Fatalf("printed %q", s)
	}
	plan, err := plans.Parse("weight=9")
	if err != nil {
		t.Fatal(err)
	}
	with, err := p.With("globex", plan)
	if err != nil {
		t.Fatal(err)
	}
	if w := with.Weights(); w["acme"] != 4 || w["globex"] != 9 {
		t.Fatalf("with globex's plan: %v", w)
	}
	if err := plan.CheckDefaults(); err == nil || !strings.Contains(err.Error(), "TENANT/weight=N") {
		t.Fatalf("weight=9 in the deployment's rules: %v", err)
	}
	for _, bad := range []string{"acme/weight=0", "acme/weight=1001", "acme/weight=2.5", "acme/weight"} {
		if _, err := plans.Parse(bad); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), "weight") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// CHANNEL:providers=A+B orders a channel's providers: in the deployment's
// rules for every tenant, in a tenant's plan (or TENANT/) for that tenant,
// printed back as written; a category, a bad or repeated name is refused.
func TestProviders(t *testing.T) {
	p, err := plans.Parse("sms:providers=default+backup,acme/sms:providers=backup,sms:recipient=1/1m")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Providers("acme", tasks.SMS); !slices.Equal(got, []string{"backup"}) {
		t.Errorf("acme: %v", got)
	}
	if got := p.Providers("globex", tasks.SMS); !slices.Equal(got, []string{"default", "backup"}) {
		t.Errorf("globex: %v", got)
	}
	if got := p.Providers("globex", tasks.Email); got != nil {
		t.Errorf("email: %v", got)
	}
	if s := p.String(); s != "sms:providers=default+backup,acme/sms:providers=backup,sms:recipient=1/1m" {
		t.Errorf("printed %q", s)
	}
	plan, err := plans.Parse("sms:providers=spare+default")
	if err != nil {
		t.Fatal(err)
	}
	with, err := p.With("initech", plan)
	if err != nil {
		t.Fatal(err)
	}
	if got := with.Providers("initech", tasks.SMS); !slices.Equal(got, []string{"spare", "default"}) {
		t.Errorf("initech's plan: %v", got)
	}
	for _, bad := range []string{"sms.otp:providers=backup", "sms:providers=", "sms:providers=Backup", "sms:providers=a+a", "sms:providers"} {
		if _, err := plans.Parse(bad); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), "providers") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
