package dashboard_test

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// openStream opens a live stream and reads its first event; close ends it.
func openStream(t *testing.T, br *browser, path string) (status int, close func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", br.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := *br.c
	c.Timeout = 0 // a stream lasts
	resp, err := c.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		sc := bufio.NewScanner(resp.Body)
		got := false
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "event: ") {
				got = true
				break
			}
		}
		if !got {
			t.Fatalf("%s: no event on an open stream", path)
		}
	}
	return resp.StatusCode, func() { cancel(); resp.Body.Close() }
}

// 64 live streams from one tenant's sessions: that tenant gets its share
// (8; 2 per session) and 429 for the rest, while the admin's overview
// stream and another tenant's stream still open.
func TestUILiveStreamsFairShares(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	codes := map[int]int{}
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	for range 32 { // 32 sessions of acme, 2 streams each
		br := newBrowser(t, b.HTTP.URL)
		br.login(b.Tokens["acme"], "/ui/tenants/acme")
		for range 2 {
			st, c := openStream(t, br, "/ui/tenants/acme/live")
			codes[st]++
			closers = append(closers, c)
		}
	}
	if codes[http.StatusOK] != 8 || codes[http.StatusTooManyRequests] != 56 {
		t.Fatalf("64 streams of one tenant: %v, want 8 × 200 and 56 × 429", codes)
	}
	one := newBrowser(t, b.HTTP.URL)
	one.login(b.Tokens["globex"], "/ui/tenants/globex")
	for i := range 3 {
		st, c := openStream(t, one, "/ui/tenants/globex/live")
		closers = append(closers, c)
		if want := map[bool]int{true: 200, false: 429}[i < 2]; st != want {
			t.Fatalf("globex's stream %d of one session: %d, want %d", i+1, st, want)
		}
	}
	admin := newBrowser(t, b.HTTP.URL)
	admin.login(adminToken, "/ui")
	if st, c := openStream(t, admin, "/ui/live"); st != 200 {
		t.Fatalf("the admin's overview stream: %d", st)
	} else {
		closers = append(closers, c)
	}
	// A stream closed gives its slot back.
	for _, c := range closers[:64] {
		c()
	}
	br := newBrowser(t, b.HTTP.URL)
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	// The server notices a closed stream at its next write: poll.
	sluicetest.EventuallyValue(t, 10*time.Second, "acme's closed streams to be given back (a stream answered 200)", func() (int, bool) {
		st, c := openStream(t, br, "/ui/tenants/acme/live")
		closers = append(closers, c)
		return st, st == 200
	})
}

// Dashboard pages count against the token's SLUICE_API_RATE, shared with
// its API requests.
func TestUIRoutesUnderTheTokenRate(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, map[string]string{"SLUICE_API_RATE": "5/1m"})
	br := newBrowser(t, b.HTTP.URL)
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	codes := map[int]int{}
	for range 5 {
		codes[br.get("/ui/tenants/acme").status]++
	}
	if codes[200] != 5 {
		t.Fatalf("5 pages under a rate of 5/1m: %v", codes)
	}
	if p := br.get("/ui/tenants/acme"); p.status != http.StatusTooManyRequests || p.header.Get("Retry-After") == "" {
		t.Fatalf("6th page: %d", p.status)
	}
	if r := b.Do(t, "GET", "/v1/quotas", b.Tokens["acme"], nil); r.Status != http.StatusTooManyRequests {
		t.Fatalf("the API with the same token after its budget went on pages: %d", r.Status)
	}
}

// A tenant's page shows its queued work against its caps.
func TestUITenantPageShowsQueuedCaps(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, map[string]string{"SLUICE_TENANT_MAX_QUEUED": "1000", "SLUICE_TENANT_MAX_QUEUED_BYTES": "2097152"})
	for _, to := range []string{"+14155550100", "+14155550101", "+14155550102"} {
		if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS(to, "hello")); r.Status != 202 {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
	}
	br := newBrowser(t, b.HTTP.URL)
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	p := br.get("/ui/tenants/acme")
	if p.status != 200 || !strings.Contains(p.body, "Queued now: 3 notifications of 1000") || !strings.Contains(p.body, "of 2.0 MiB") {
		i := strings.Index(p.body, "Queued now")
		t.Fatalf("tenant page: %d, queued line %q", p.status, p.body[max(0, i):min(len(p.body), max(0, i)+160)])
	}
}

// A live stream open when its session signs out, or its token is revoked,
// receives nothing more than a second later and ends.
func TestUILiveStreamEndsWithItsSession(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, uiRules, nil)
	for _, how := range []string{"logout", "revoke"} {
		t.Run(how, func(t *testing.T) {
			tok := b.Tokens["acme"]
			if how == "revoke" {
				var err error
				if tok, _, err = b.API.Tokens().Create(context.Background(), "acme", "stream-"+how, "test"); err != nil {
					t.Fatal(err)
				}
			}
			br := newBrowser(t, b.HTTP.URL)
			br.login(tok, "/ui/tenants/acme")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", b.HTTP.URL+"/ui/tenants/acme/live", nil)
			c := *br.c
			c.Timeout = 0
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			events := readEvents(resp.Body)
			for range 2 { // the stream is live: two events, a tick apart
				if _, ok := <-events; !ok {
					t.Fatal("the stream ended before the session did")
				}
			}
			if how == "logout" {
				if p := br.do("POST", "/ui/logout", url.Values{"csrf": {br.csrf("/ui/tenants/acme")}}); p.status != http.StatusSeeOther {
					t.Fatalf("logout: %d", p.status)
				}
			} else if err := b.API.Tokens().Revoke(context.Background(), "acme", tok); err != nil {
				t.Fatal(err)
			}
			ended := time.Now()
			for ev := range events {
				if late := time.Since(ended); late > time.Second {
					t.Fatalf("event %q received %v after the %s", ev[0], late, how)
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("the stream did not end after the %s", how)
			}
		})
	}
}

// The stream caps leave at least three quarters of SLUICE_API_MAX_CONNS
// to requests at every allowed setting, and keep the admin a stream of
// its own and each share within the total.
func TestStreamCapsInsideTheConnectionCap(t *testing.T) {
	t.Parallel()
	if c := dashboard.StreamCaps(1024); c != (dashboard.Caps{Total: 64, Admin: 8, Tenant: 8, Session: 2}) {
		t.Errorf("at 1024: %+v, want the caps of before (64, 8, 8, 2)", c)
	}
	for conns := 16; conns <= 1<<20; conns = conns*3/2 + 1 {
		c := dashboard.StreamCaps(conns)
		if c.Total*dashboard.StreamShare > conns || c.Admin < 1 || c.Tenant < 1 || c.Session < 1 ||
			c.Admin+c.Tenant > c.Total || c.Session > c.Tenant {
			t.Errorf("at %d connections: %+v", conns, c)
		}
	}
}
