package digest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// newStore is a digest store on a redis-server of its own.
func newStore(t *testing.T) *digest.Store {
	t.Helper()
	rdb := redistest.Start(t).Client(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	return digest.New(rdb, lim)
}

// Many workers' items for one recipient, joined concurrently while the
// carriers close their digests at random moments: every item ends in
// exactly one digest (its own, as carrier, or one it joined), no digest
// holds more than max, and what a carrier reads back at its close is
// exactly itself and the items told they joined it. Repeated trials.
func TestJoinsAndClosesUnderConcurrency(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	d := plans.Digest{Max: 7}
	for trial := 0; trial < 5; trial++ {
		const items, workers = 300, 16
		ns := make([]tasks.Notification, items)
		for i := range ns {
			ns[i] = tasks.NewEmail("acme", "jane@example.com", "s", fmt.Sprintf("item %d", i))
			ns[i].Category = fmt.Sprintf("comment%d", trial)
		}
		var mu sync.Mutex
		joined := map[string][]string{} // carrier → items told they joined it
		var carriers []tasks.Notification
		read := map[string][]digest.Item{} // carrier → items read at its close
		closeOne := func(c tasks.Notification) {
			its, err := s.Close(ctx, c, d)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			read[c.ID] = its
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Go(func() {
				for i := w; i < items; i += workers {
					n := ns[i]
					it := digest.Item{TaskID: n.ID, Type: tasks.TypeEmail, Payload: []byte(n.Body)}
					o, err := s.Join(ctx, n, d, it, time.Minute, false)
					if err == nil && o.Kind == digest.Open {
						o, err = s.Join(ctx, n, d, it, time.Minute, true)
					}
					out, carrier := o.Kind, o.Carrier
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					switch out {
					case digest.Joined:
						joined[carrier] = append(joined[carrier], n.ID)
					case digest.Started:
						carriers = append(carriers, n)
					default:
						t.Errorf("item %d: outcome %d", i, out)
					}
					// Now and then the oldest open carrier is sent: it closes.
					var c *tasks.Notification
					if i%11 == 0 && len(carriers) > 0 {
						if _, done := read[carriers[0].ID]; !done {
							c = &carriers[0]
						}
					}
					mu.Unlock()
					if c != nil {
						closeOne(*c)
					}
				}
			})
		}
		wg.Wait()
		for _, c := range carriers {
			if _, done := read[c.ID]; !done {
				closeOne(c)
			}
		}
		seen := map[string]int{}
		for _, c := range carriers {
			its := read[c.ID]
			if len(its) == 0 || its[0].TaskID != c.ID {
				t.Fatalf("trial %d: carrier %s read %d items, its own not first", trial, c.ID, len(its))
			}
			if len(its) > d.Max {
				t.Errorf("trial %d: a digest of %d items, over max %d", trial, len(its), d.Max)
			}
			if len(its)-1 != len(joined[c.ID]) {
				t.Errorf("trial %d: carrier %s read %d others, %d were told they joined it", trial, c.ID, len(its)-1, len(joined[c.ID]))
			}
			for _, it := range its {
				seen[it.TaskID]++
			}
			// A closed digest reads the same again (a re-run after a crash).
			again, err := s.Close(ctx, c, d)
			if err != nil || len(again) != len(its) {
				t.Errorf("trial %d: a second close read %d items (%v), the first %d", trial, len(again), err, len(its))
			}
		}
		for _, n := range ns {
			if seen[n.ID] != 1 {
				t.Errorf("trial %d: item %s is in %d digests, want exactly 1", trial, n.ID, seen[n.ID])
			}
			if by, err := s.CarriedBy(ctx, n.Tenant, n.ID); err != nil || (by == "") != (read[n.ID] != nil) {
				t.Errorf("trial %d: item %s carried by %q (%v); carriers carry themselves, every other item a carrier", trial, n.ID, by, err)
			}
		}
		t.Logf("trial %d: %d items in %d digests", trial, items, len(carriers))
	}
}

func TestRender(t *testing.T) {
	c := tasks.NewEmail("acme", "jane@example.com", "Ana commented", "Looks good")
	c.HTML = "<p>Looks good</p>"
	o := tasks.NewEmail("acme", "jane@example.com", "Li <b>commented</b>", "Ship it & <go>")
	m, err := digest.Render(c, []tasks.Notification{c, o})
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != c.ID || m.To != c.To || m.Subject != "Ana commented (+1 more)" {
		t.Errorf("digest: %+v", m)
	}
	if want := "Ana commented\nLooks good\n\nLi <b>commented</b>\nShip it & <go>\n"; m.Body != want {
		t.Errorf("text %q, want %q", m.Body, want)
	}
	if want := "<ul><li><strong>Ana commented</strong><br>Looks good</li><li><strong>Li &lt;b&gt;commented&lt;/b&gt;</strong><br>Ship it &amp; &lt;go&gt;</li></ul>"; m.HTML != want {
		t.Errorf("html %q, want %q (escaped)", m.HTML, want)
	}
	var long []tasks.Notification
	for i := 0; i < 200; i++ {
		long = append(long, tasks.NewSMS("acme", "+14155550100", fmt.Sprintf("Update number %d is here", i)))
	}
	sms, err := digest.Render(long[0], long)
	if err != nil {
		t.Fatal(err)
	}
	if r := []rune(sms.Body); len(r) != tasks.MaxSMSRunes || r[len(r)-1] != '…' {
		t.Errorf("an SMS digest of 200 updates: %d runes, want cut to %d with an ellipsis", len(r), tasks.MaxSMSRunes)
	}
}

// A tenant's template replaces the built-in one field by field; the HTML
// part escapes what the items carry; a template that fails is refused by
// Check (and so never stored).
func TestTemplates(t *testing.T) {
	c := tasks.NewEmail("acme", "jane@example.com", "A", "one")
	c.HTML = "<p>one</p>"
	o := tasks.NewEmail("acme", "jane@example.com", "B", "<script>x</script>")
	tmpl := &digest.Template{Subject: "{{.Count}} new", HTML: `<ol>{{range .Items}}<li>{{.Body}}</li>{{end}}</ol>`}
	if err := tmpl.Check(tasks.Email); err != nil {
		t.Fatal(err)
	}
	m, err := digest.RenderWith(c, []tasks.Notification{c, o}, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "2 new" || m.HTML != "<ol><li>one</li><li>&lt;script&gt;x&lt;/script&gt;</li></ol>" || !strings.Contains(m.Body, "B\n<script>x</script>") {
		t.Errorf("rendered: subject %q, html %q, text %q", m.Subject, m.HTML, m.Body)
	}
	for _, bad := range []digest.Template{{Subject: "{{.Count"}, {Text: "{{.Missing}}"}, {HTML: "{{.First.Nope}}"}, {Text: "{{index .Items 1000}}"}} {
		if err := bad.Check(tasks.Email); !errors.Is(err, digest.ErrBadTemplate) {
			t.Errorf("%+v: %v, want ErrBadTemplate", bad, err)
		}
	}
	if err := (digest.Template{Subject: "x"}).Check(tasks.SMS); !errors.Is(err, digest.ErrBadTemplate) {
		t.Errorf("an SMS template with a subject: %v", err)
	}
}

// OpenFor reads the digest open for a recipient, as sluice quota show
// prints it: none, then the carrier with its count, none again once closed.
func TestOpenFor(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx, d := context.Background(), plans.Digest{Max: 5}
	a := tasks.NewEmail("acme", "Jane@Example.com", "s", "a")
	b := tasks.NewEmail("acme", "jane@example.com", "s", "b")
	if o, err := s.OpenFor(ctx, a, d); err != nil || o != nil {
		t.Fatalf("before: %+v, %v", o, err)
	}
	for _, n := range []tasks.Notification{a, b} {
		if _, err := s.Join(ctx, n, d, digest.Item{TaskID: n.ID, Type: tasks.TypeEmail, Payload: []byte("p")}, time.Minute, true); err != nil {
			t.Fatal(err)
		}
	}
	if o, err := s.OpenFor(ctx, b, d); err != nil || o == nil || o.Carrier != a.ID || o.Items != 2 {
		t.Fatalf("open: %+v, %v; want a's, 2 items (the address normalised)", o, err)
	}
	if _, err := s.Close(ctx, a, d); err != nil {
		t.Fatal(err)
	}
	if o, err := s.OpenFor(ctx, a, d); err != nil || o != nil {
		t.Fatalf("after the close: %+v, %v", o, err)
	}
}

// A task run again after a crash keeps what its earlier run did (issue
// 53): an item that joined a digest is Joined to that one again, even once
// it closed and another opened; JoinFirst answers Rerun for a notification
// the limiter has a record of (checked for a send of its own) and Carrier,
// with the opening's time, for a carrier; an item Released (handed back by
// a spill) joins anew.
func TestRerunsKeepTheirDigest(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	s := digest.New(rdb, lim)
	ctx, d := context.Background(), plans.Digest{Max: 5, Window: time.Second}
	n := func(body string) tasks.Notification { return tasks.NewSMS("acme", "+14155550100", body) }
	item := func(x tasks.Notification) digest.Item {
		return digest.Item{TaskID: x.ID, Type: tasks.TypeSMS, Payload: []byte(x.Body)}
	}
	c1, a, c2 := n("c1"), n("a"), n("c2")
	before, _ := rdb.Time(ctx).Result()
	o, err := s.JoinFirst(ctx, c1, d, item(c1), time.Minute, true)
	after, _ := rdb.Time(ctx).Result()
	if err != nil || o.Kind != digest.Started || o.Opened.Before(before.Truncate(time.Microsecond)) || o.Opened.After(after) {
		t.Fatalf("c1 opens: %+v, %v; want Started, opened between %v and %v (Redis TIME)", o, err, before, after)
	}
	if o, err := s.JoinFirst(ctx, a, d, item(a), time.Minute, true); err != nil || o.Kind != digest.Joined || o.Carrier != c1.ID || o.Again {
		t.Fatalf("a joins: %+v, %v", o, err)
	}
	opened := o.Opened
	if o, err := s.JoinFirst(ctx, c1, d, item(c1), time.Minute, true); err != nil || o.Kind != digest.Carrier || !o.Opened.Equal(opened) {
		t.Fatalf("c1 again: %+v, %v; want Carrier, opened %v", o, err, opened)
	}
	if items, err := s.Close(ctx, c1, d); err != nil || len(items) != 2 {
		t.Fatalf("close: %d items, %v", len(items), err)
	}
	if o, err := s.JoinFirst(ctx, c2, d, item(c2), time.Minute, true); err != nil || o.Kind != digest.Started {
		t.Fatalf("c2 opens the next: %+v, %v", o, err)
	}
	// a's task runs again (its completion was lost): still c1's, not c2's.
	for _, join := range []func(context.Context, tasks.Notification, plans.Digest, digest.Item, time.Duration, bool) (digest.Outcome, error){s.Join, s.JoinFirst} {
		if o, err := join(ctx, a, d, item(a), time.Minute, true); err != nil || o.Kind != digest.Joined || o.Carrier != c1.ID || !o.Again {
			t.Fatalf("a's re-run: %+v, %v; want Joined to %s", o, err, c1.ID)
		}
	}
	// A send checked before (its record in the limiter) is a re-run of it.
	single := n("single")
	lims := []throttle.Limit{{Scope: "sms:recipient", Subject: single.To, Rule: throttle.Rule{Limit: 10, Window: time.Minute}}}
	if _, err := lim.Reserve(ctx, "acme", single.ID, throttle.ReserveOptions{Policy: throttle.AtLeastOnce}, lims...); err != nil {
		t.Fatal(err)
	}
	if o, err := s.JoinFirst(ctx, single, d, item(single), time.Minute, true); err != nil || o.Kind != digest.Rerun {
		t.Fatalf("a send checked before, on its first look: %+v, %v; want Rerun", o, err)
	}
	if items, err := s.Close(ctx, c2, d); err != nil || len(items) != 1 {
		t.Fatalf("c2's digest: %d items, %v; want its own only", len(items), err)
	}
	// Handed back by a spill, a joins anew.
	if err := s.Release(ctx, c1, []string{a.ID}); err != nil {
		t.Fatal(err)
	}
	if o, err := s.Join(ctx, a, d, item(a), time.Minute, true); err != nil || o.Kind != digest.Started {
		t.Fatalf("a released: %+v, %v; want Started (no digest open)", o, err)
	}
}
