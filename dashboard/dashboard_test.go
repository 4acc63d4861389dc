package dashboard_test

import (
	"bufio"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

const uiRules = "sms:recipient=1/1m,sms:tenant=1000/1h,email:tenant=5/1h drop"

const wantCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// browser is a cookie-keeping HTTP client that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Its own transport: httptest.Server.Close, in a test running beside
	// this one, closes http.DefaultTransport's idle connections, and a POST
	// that had just picked one up failed ("CloseIdleConnections called";
	// a POST is not retried).
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, Timeout: 10 * time.Second, Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) do(method, path string, form url.Values, headers ...string) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return page{resp.StatusCode, resp.Header, string(raw)}
}

func (b *browser) get(path string) page { b.t.Helper(); return b.do("GET", path, nil) }

// login signs in with token and checks where it lands.
func (b *browser) login(token, wantAt string) {
	b.t.Helper()
	p := b.do("POST", "/ui/login", url.Values{"token": {token}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != wantAt {
		b.t.Fatalf("login: %d to %q, want 303 to %q: %s", p.status, p.header.Get("Location"), wantAt, p.body)
	}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token from a page of the session.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	p := b.get(path)
	m := csrfField.FindStringSubmatch(p.body)
	if p.status != 200 || m == nil {
		b.t.Fatalf("no CSRF token on %s (%d): %s", path, p.status, p.body)
	}
	return m[1]
}

// fill admits n sends into tenant's window of rule, as a worker would.
func fill(t *testing.T, b *bundle, tenant, scope, rule, subject string, n int) {
	t.Helper()
	lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(b.Config.SubjectSecret), CompactMembers: b.Config.CompactMembers, Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	r, err := throttle.ParseRule(rule)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		d, err := lim.Allow(context.Background(), tenant, tasks.NewID(), throttle.Limit{Scope: scope, Rule: r, Subject: subject})
		if err != nil || !d.Allowed {
			t.Fatalf("fill %s %s: %+v %v", scope, rule, d, err)
		}
	}
}

// usedIn reads the used count of a window from GET /v1/quotas.
func usedIn(t *testing.T, b *bundle, tenant, scope, rule string) int {
	t.Helper()
	var q struct {
		Windows []struct {
			Scope, Rule string
			Used        int
		}
	}
	b.Do(t, "GET", "/v1/quotas?tenant="+tenant, adminToken, nil).JSON(t, &q)
	for _, w := range q.Windows {
		if w.Scope == scope && w.Rule == rule {
			return w.Used
		}
	}
	t.Fatalf("no window %s %s in %+v", scope, rule, q)
	return 0
}

// Signing in: a bad token is refused with no cookie; a tenant token lands
// on its tenant's page with an HttpOnly, SameSite=Strict cookie scoped to
// /ui; the session ends with a tampered cookie, a revoked token or a
// sign-out.
func TestUILoginAndSession(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	br := newBrowser(t, b.HTTP.URL)
	if p := br.get("/ui"); p.status != http.StatusSeeOther || p.header.Get("Location") != "/ui/login?next=%2Fui" {
		t.Fatalf("signed out /ui: %d to %q", p.status, p.header.Get("Location"))
	}
	p := br.get("/ui/login")
	if p.status != 200 || !strings.Contains(p.body, `<label for="token">`) || !strings.Contains(p.body, `type="password"`) {
		t.Fatalf("login form: %d %s", p.status, p.body)
	}
	p = br.do("POST", "/ui/login", url.Values{"token": {"sluice_0000_wrong"}})
	if p.status != http.StatusUnauthorized || p.header.Get("Set-Cookie") != "" || !strings.Contains(p.body, "unknown or revoked") {
		t.Fatalf("bad token: %d cookie %q: %s", p.status, p.header.Get("Set-Cookie"), p.body)
	}
	p = br.do("POST", "/ui/login", url.Values{"token": {b.Tokens["acme"]}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/ui/tenants/acme" {
		t.Fatalf("tenant login: %d to %q", p.status, p.header.Get("Location"))
	}
	c := parseSetCookie(t, p.header.Get("Set-Cookie"))
	if !c.HttpOnly || c.Secure || c.SameSite != http.SameSiteStrictMode || c.Path != "/ui" || c.MaxAge <= 0 {
		t.Fatalf("session cookie over plain HTTP: %+v", c)
	}
	if strings.Contains(c.Value, b.Tokens["acme"]) || strings.Contains(c.Value, strings.Split(b.Tokens["acme"], "_")[2]) {
		t.Fatal("the cookie holds the token")
	}
	if p := br.get("/ui"); p.status != http.StatusSeeOther || p.header.Get("Location") != "/ui/tenants/acme" {
		t.Fatalf("tenant at /ui: %d to %q", p.status, p.header.Get("Location"))
	}
	if p := br.get("/ui/tenants/acme"); p.status != 200 || !strings.Contains(p.body, "<h1>Tenant acme</h1>") {
		t.Fatalf("tenant page: %d %s", p.status, p.body)
	}

	// A tampered cookie is no session.
	u, _ := url.Parse(b.HTTP.URL + "/ui")
	forged := *c
	forged.Value = strings.Replace(c.Value, c.Value[:8], "AAAAAAAA", 1)
	other := newBrowser(t, b.HTTP.URL)
	other.c.Jar.SetCookies(u, []*http.Cookie{&forged})
	if p := other.get("/ui/tenants/acme"); p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/ui/login") {
		t.Fatalf("forged cookie: %d to %q", p.status, p.header.Get("Location"))
	}

	// Signing out needs the form's CSRF token, then ends the session.
	if p := br.do("POST", "/ui/logout", url.Values{}); p.status != http.StatusForbidden {
		t.Fatalf("logout without CSRF token: %d", p.status)
	}
	if p := br.do("POST", "/ui/logout", url.Values{"csrf": {br.csrf("/ui/tenants/acme")}}); p.status != http.StatusSeeOther {
		t.Fatalf("logout: %d %s", p.status, p.body)
	}
	if p := br.get("/ui/tenants/acme"); p.status != http.StatusSeeOther {
		t.Fatalf("after logout: %d", p.status)
	}

	// Revoking the token ends its sessions at the next request.
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	if err := b.API.Tokens().Revoke(context.Background(), "acme", b.Tokens["acme"]); err != nil {
		t.Fatal(err)
	}
	if p := br.get("/ui/tenants/acme"); p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/ui/login") {
		t.Fatalf("revoked token's session: %d to %q", p.status, p.header.Get("Location"))
	}
	if p := br.get("/ui/tenants/acme/live"); p.status != http.StatusUnauthorized {
		t.Fatalf("revoked token's stream: %d", p.status)
	}

	// The admin lands on the overview, which lists both tenants.
	admin := newBrowser(t, b.HTTP.URL)
	admin.login(adminToken, "/ui")
	if p := admin.get("/ui"); p.status != 200 || !strings.Contains(p.body, `data-tenant="globex"`) || !strings.Contains(p.body, "Queue depths") {
		t.Fatalf("overview: %d %s", p.status, p.body)
	}
}

// Over TLS the session cookie is Secure.
func TestUISecureCookieOverTLS(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	srv := httptest.NewTLSServer(b.API.Handler())
	t.Cleanup(srv.Close)
	c := srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.PostForm(srv.URL+"/ui/login", url.Values{"token": {adminToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.TLS == nil || resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login over TLS: %d", resp.StatusCode)
	}
	if ck := parseSetCookie(t, resp.Header.Get("Set-Cookie")); !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie over TLS: %+v", ck)
	}
}

func parseSetCookie(t *testing.T, h string) *http.Cookie {
	t.Helper()
	c, err := http.ParseSetCookie(h)
	if err != nil {
		t.Fatalf("Set-Cookie %q: %v", h, err)
	}
	return c
}

// Behind a TLS-terminating proxy (X-Forwarded-Proto: https, or
// Forwarded: proto=https) the session cookie is Secure too; plain HTTP
// without either, not.
func TestUISecureCookieBehindAProxy(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	for _, tc := range []struct {
		header, value string
		secure        bool
	}{{"X-Forwarded-Proto", "https", true}, {"Forwarded", `for=203.0.113.7;proto=https`, true}, {"X-Forwarded-Proto", "http", false}, {"", "", false}} {
		br := newBrowser(t, b.HTTP.URL)
		var hs []string
		if tc.header != "" {
			hs = []string{tc.header, tc.value}
		}
		p := br.do("POST", "/ui/login", url.Values{"token": {b.Tokens["acme"]}}, hs...)
		if p.status != http.StatusSeeOther {
			t.Fatalf("%s: %v: login %d", tc.header, tc.value, p.status)
		}
		if c := parseSetCookie(t, p.header.Get("Set-Cookie")); c.Secure != tc.secure {
			t.Errorf("%s: %s: cookie Secure=%v, want %v", tc.header, tc.value, c.Secure, tc.secure)
		}
	}
}

// A tenant's sign-in sees its own tenant only: every route of another
// tenant answers 403 with nothing of it in the answer, and its own pages
// name no other tenant.
func TestUITenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], apienv.NewSMS("+14155550199", "globex secret"))
	fill(t, b, "globex", "sms:tenant", "1000/1h", "", 3)
	acme := newBrowser(t, b.HTTP.URL)
	acme.login(b.Tokens["acme"], "/ui/tenants/acme")
	csrf := acme.csrf("/ui/tenants/acme")
	for _, req := range []struct {
		method, path string
		form         url.Values
	}{
		{"GET", "/ui/tenants/globex", nil},
		{"GET", "/ui/tenants/globex/live", nil},
		{"GET", "/ui/tenants/globex/chart.svg?channel=sms", nil},
		{"GET", "/ui/tenants/globex/reset?window=sms:tenant:3600000", nil},
		{"POST", "/ui/tenants/globex/reset", url.Values{"csrf": {csrf}, "window": {"sms:tenant:3600000"}, "confirm": {"yes"}}},
		{"POST", "/ui/tenants/globex/recipient", url.Values{"csrf": {csrf}, "recipient": {"+14155550199"}}},
	} {
		p := acme.do(req.method, req.path, req.form)
		if p.status != http.StatusForbidden {
			t.Errorf("%s %s as acme: %d, want 403: %s", req.method, req.path, p.status, p.body)
		}
		if strings.Contains(p.body, "globex") || strings.Contains(p.body, "0199") {
			t.Errorf("%s %s as acme names the other tenant: %s", req.method, req.path, p.body)
		}
	}
	if usedIn(t, b, "globex", "sms:tenant", "1000/1h") != 3 {
		t.Fatal("acme's refused reset touched globex's window")
	}
	// Its own overview and page: nothing of globex.
	for _, path := range []string{"/ui/tenants/acme", "/ui/tenants/acme/chart.svg?channel=sms"} {
		p := acme.get(path)
		if p.status != 200 || strings.Contains(p.body, "globex") {
			t.Fatalf("%s as acme: %d, names globex: %v", path, p.status, strings.Contains(p.body, "globex"))
		}
	}
	if p := acme.get("/ui/live"); p.status != http.StatusForbidden {
		t.Fatalf("acme's overview stream: %d", p.status)
	}
	// The admin sees globex, its window and its queued message (masked).
	admin := newBrowser(t, b.HTTP.URL)
	admin.login(adminToken, "/ui")
	p := admin.get("/ui/tenants/globex")
	if p.status != 200 || !strings.Contains(p.body, `data-window="sms:tenant:3600000" data-used="3"`) || !strings.Contains(p.body, "1 queued") {
		t.Fatalf("globex as admin: %d %s", p.status, p.body)
	}
}

// The reset form asks first and works only with the session's CSRF token,
// from this site, confirmed, and for the admin.
func TestUIResetNeedsCSRFAndConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	fill(t, b, "acme", "sms:tenant", "1000/1h", "", 4)
	admin := newBrowser(t, b.HTTP.URL)
	admin.login(adminToken, "/ui")
	p := admin.get("/ui/tenants/acme/reset?window=sms:tenant:3600000")
	if p.status != 200 || !strings.Contains(p.body, "Reset a quota window?") || !strings.Contains(p.body, "<strong>4</strong> sends") ||
		!strings.Contains(p.body, `name="confirm" value="yes"`) {
		t.Fatalf("confirmation page: %d %s", p.status, p.body)
	}
	csrf := csrfField.FindStringSubmatch(p.body)[1]
	form := func(kv ...string) url.Values {
		v := url.Values{"window": {"sms:tenant:3600000"}, "confirm": {"yes"}, "csrf": {csrf}}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				v.Del(kv[i])
			} else {
				v.Set(kv[i], kv[i+1])
			}
		}
		return v
	}
	for _, c := range []struct {
		name    string
		form    url.Values
		headers []string
		want    int
	}{
		{"NoToken", form("csrf", ""), nil, http.StatusForbidden},
		{"WrongToken", form("csrf", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), nil, http.StatusForbidden},
		{"CrossSite", form(), []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}, http.StatusForbidden},
		{"NotConfirmed", form("confirm", ""), nil, http.StatusBadRequest},
		{"UnknownWindow", form("window", "sms:tenant:60000"), nil, http.StatusNotFound},
	} {
		if p := admin.do("POST", "/ui/tenants/acme/reset", c.form, c.headers...); p.status != c.want {
			t.Errorf("%s: %d, want %d: %s", c.name, p.status, c.want, p.body)
		}
	}
	if n := usedIn(t, b, "acme", "sms:tenant", "1000/1h"); n != 4 {
		t.Fatalf("a refused reset changed the window: used %d", n)
	}
	// A tenant's own sign-in, with its own valid token, may not lift its quota.
	acme := newBrowser(t, b.HTTP.URL)
	acme.login(b.Tokens["acme"], "/ui/tenants/acme")
	tok := acme.csrf("/ui/tenants/acme")
	if p := acme.do("POST", "/ui/tenants/acme/reset", url.Values{"window": {"sms:tenant:3600000"}, "confirm": {"yes"}, "csrf": {tok}}); p.status != http.StatusForbidden {
		t.Fatalf("tenant reset: %d", p.status)
	}
	if strings.Contains(acme.get("/ui/tenants/acme").body, "Reset…") {
		t.Fatal("a tenant's page offers a reset")
	}
	// Another session's token is not this one's.
	if p := admin.do("POST", "/ui/tenants/acme/reset", form("csrf", tok)); p.status != http.StatusForbidden {
		t.Fatalf("reset with another session's CSRF token: %d", p.status)
	}
	p = admin.do("POST", "/ui/tenants/acme/reset", form())
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/ui/tenants/acme?reset=") {
		t.Fatalf("reset: %d to %q: %s", p.status, p.header.Get("Location"), p.body)
	}
	if n := usedIn(t, b, "acme", "sms:tenant", "1000/1h"); n != 0 {
		t.Fatalf("after the reset: used %d", n)
	}
	if p := admin.get(p.header.Get("Location")); !strings.Contains(p.body, `class="flash" role="status"`) {
		t.Fatalf("no confirmation after the reset: %s", p.body)
	}
	// The note names only a window of the tenant: a link cannot put words on the page.
	if p := admin.get("/ui/tenants/acme?reset=" + url.QueryEscape("your account is locked, call us")); strings.Contains(p.body, "locked") || strings.Contains(p.body, `class="flash"`) {
		t.Fatalf("a crafted reset note shows: %s", p.body)
	}
}

// browserFrom is a browser whose connections come from local address ip
// (another loopback address: another client to the server).
func browserFrom(t *testing.T, base, ip string) *browser {
	t.Helper()
	br := newBrowser(t, base)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	br.c.Transport = &http.Transport{DialContext: d.DialContext}
	return br
}

// Failed sign-ins are limited per client, counting failures only: after
// 100 failed logins from one address that address gets 429 (even with the
// admin token: its credentials are not checked), while the admin token
// still signs in from another address. With a trusted proxy header the
// client is the header's last entry: the same peer address signs in for
// another client behind the proxy.
func TestUIFailedLoginsLimitedPerClient(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, map[string]string{"SLUICE_API_AUTH_FAILURES": "20/1m"})
	bad := browserFrom(t, b.HTTP.URL, "127.0.0.1")
	codes := map[int]int{}
	for range 100 {
		codes[bad.do("POST", "/ui/login", url.Values{"token": {"guess"}}).status]++
	}
	if codes[http.StatusUnauthorized] != 20 || codes[http.StatusTooManyRequests] != 80 {
		t.Fatalf("100 failed logins: %v, want 20 × 401 then 80 × 429", codes)
	}
	p := bad.do("POST", "/ui/login", url.Values{"token": {adminToken}})
	if p.status != http.StatusTooManyRequests || p.header.Get("Retry-After") == "" || p.header.Get("Set-Cookie") != "" {
		t.Fatalf("admin token from the locked address: %d, Retry-After %q", p.status, p.header.Get("Retry-After"))
	}
	browserFrom(t, b.HTTP.URL, "127.0.0.2").login(adminToken, "/ui")
	// Successful sign-ins never count: the other address stays open.
	for range 30 {
		browserFrom(t, b.HTTP.URL, "127.0.0.2").login(b.Tokens["acme"], "/ui/tenants/acme")
	}

	// Behind a proxy: the header names the client.
	px := setup(t, uiRules, map[string]string{"SLUICE_API_AUTH_FAILURES": "20/1m", "SLUICE_API_CLIENT_IP_HEADER": "X-Forwarded-For"})
	proxy := newBrowser(t, px.HTTP.URL)
	for range 100 {
		proxy.do("POST", "/ui/login", url.Values{"token": {"guess"}}, "X-Forwarded-For", "203.0.113.7")
	}
	if p := proxy.do("POST", "/ui/login", url.Values{"token": {adminToken}}, "X-Forwarded-For", "203.0.113.7"); p.status != http.StatusTooManyRequests {
		t.Fatalf("admin token for the locked client behind the proxy: %d", p.status)
	}
	// A client may send its own X-Forwarded-For: only the last entry, the
	// proxy's, counts.
	if p := proxy.do("POST", "/ui/login", url.Values{"token": {adminToken}}, "X-Forwarded-For", "203.0.113.7, 198.51.100.9"); p.status != http.StatusSeeOther {
		t.Fatalf("admin token for another client behind the proxy (same peer address): %d %s", p.status, p.body)
	}

	// /v1: failed bearer tokens are limited per client too (429
	// auth-limited), a valid token from another client is served.
	v1 := map[int]int{}
	for i := range 30 {
		req, _ := http.NewRequest("GET", px.HTTP.URL+"/v1/quotas", nil)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer sluice_%04d_random", i))
		req.Header.Set("X-Forwarded-For", "203.0.113.50")
		resp, err := sluicetest.Client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		v1[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	if v1[http.StatusUnauthorized] != 20 || v1[http.StatusTooManyRequests] != 10 {
		t.Fatalf("30 random bearer tokens from one client: %v, want 20 × 401, 10 × 429", v1)
	}
	req, _ := http.NewRequest("GET", px.HTTP.URL+"/v1/quotas?tenant=acme", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("X-Forwarded-For", "198.51.100.10")
	resp, err := sluicetest.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("valid token from another client: %d", resp.StatusCode)
	}
}

// A session ends at sign-out server-side: its cookie, replayed, gets the
// login page (and 401 for a POST with its CSRF token); and when its token
// is revoked.
func TestUISessionEndsAtLogoutAndRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	u, _ := url.Parse(b.HTTP.URL + "/ui")
	for _, how := range []string{"logout", "revoke"} {
		tok := b.Tokens["acme"]
		if how == "revoke" {
			var err error
			if tok, _, err = b.API.Tokens().Create(context.Background(), "acme", "revoke", "test"); err != nil {
				t.Fatal(err)
			}
		}
		br := newBrowser(t, b.HTTP.URL)
		br.login(tok, "/ui/tenants/acme")
		cookies := br.c.Jar.Cookies(u)
		csrf := br.csrf("/ui/tenants/acme")
		if how == "logout" {
			if p := br.do("POST", "/ui/logout", url.Values{"csrf": {csrf}}); p.status != http.StatusSeeOther {
				t.Fatalf("logout: %d", p.status)
			}
		} else if err := b.API.Tokens().Revoke(context.Background(), "acme", tok); err != nil {
			t.Fatal(err)
		}
		replay := newBrowser(t, b.HTTP.URL)
		replay.c.Jar.SetCookies(u, cookies)
		if p := replay.get("/ui/tenants/acme"); p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/ui/login") {
			t.Fatalf("%s: replayed cookie: %d to %q", how, p.status, p.header.Get("Location"))
		}
		replay.c.Jar.SetCookies(u, cookies)
		if p := replay.do("POST", "/ui/logout", url.Values{"csrf": {csrf}}); p.status != http.StatusUnauthorized {
			t.Fatalf("%s: replayed cookie and CSRF token on a POST: %d", how, p.status)
		}
	}
}

var (
	inlineScript = regexp.MustCompile(`(?i)<script(\s[^>]*)?>\s*[^<\s]`)
	scriptNoSrc  = regexp.MustCompile(`(?i)<script\b[^>]*>`)
	inlineStyle  = regexp.MustCompile(`(?i)\sstyle=|<style`)
	inlineEvent  = regexp.MustCompile(`(?i)\son[a-z]+=`)
)

// Every answer carries the CSP and the other security headers; no page
// holds an inline script, style or event handler the CSP would block.
func TestUISecurityHeadersAndNoInlineCode(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	fill(t, b, "acme", "sms:tenant", "1000/1h", "", 2)
	b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550100", "hi"))
	admin := newBrowser(t, b.HTTP.URL)
	for _, path := range []string{"/ui/login", "/ui/nope"} {
		checkHeaders(t, path, admin.get(path))
	}
	admin.login(adminToken, "/ui")
	for _, path := range []string{"/ui", "/ui/tenants/acme", "/ui/tenants/acme/reset?window=sms:tenant:3600000", "/ui/tenants/acme/chart.svg?channel=sms", "/ui/nope"} {
		p := admin.get(path)
		checkHeaders(t, path, p)
		if p.header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s: Cache-Control %q", path, p.header.Get("Cache-Control"))
		}
		if strings.Contains(path, ".svg") {
			if strings.Contains(p.body, "<script") || inlineStyle.MatchString(p.body) {
				t.Errorf("%s holds a script or a style element", path)
			}
			continue
		}
		if inlineScript.MatchString(p.body) || inlineStyle.MatchString(p.body) || inlineEvent.MatchString(p.body) {
			t.Errorf("%s holds inline code: %s", path, p.body)
		}
		for _, tag := range scriptNoSrc.FindAllString(p.body, -1) {
			if !strings.Contains(tag, `src="/ui/static/`) {
				t.Errorf("%s: script %s", path, tag)
			}
		}
		if !strings.Contains(p.body, `<html lang="en">`) || !strings.Contains(p.body, `<main id="main"`) {
			t.Errorf("%s: no lang or main landmark", path)
		}
	}
	for _, asset := range []string{"ui.css", "ui.js"} {
		p := admin.get("/ui/static/" + asset)
		checkHeaders(t, asset, p)
		if p.status != 200 || len(p.body) < 100 {
			t.Errorf("%s: %d", asset, p.status)
		}
	}
	if p := admin.get("/ui/static/../server.go"); p.status == 200 {
		t.Fatal("static files escape their folder")
	}
}

func checkHeaders(t *testing.T, what string, p page) {
	t.Helper()
	for k, want := range map[string]string{
		"Content-Security-Policy": wantCSP,
		"X-Content-Type-Options":  "nosniff",
		"X-Frame-Options":         "DENY",
		"Referrer-Policy":         "same-origin",
	} {
		if got := p.header.Get(k); got != want {
			t.Errorf("%s (%d): %s: %q, want %q", what, p.status, k, got, want)
		}
	}
}

// A recipient lookup shows the recipient's windows and messages with the
// recipient masked; the number is neither in the page, nor in a URL, nor
// in the log (debug level included).
func TestUIRecipientLookupNeverShowsOrLogsTheRecipient(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	var logs sluicetest.LogBuffer
	logged := b.Another(t, app.APIOptions{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	fill(t, b, "acme", "sms:recipient", "1/1m", "+14155550100", 1)
	b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550100", "hi"))
	b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550111", "someone else"))
	b.Do(t, "POST", "/v1/suppressions/sms/+14155550100", b.Tokens["acme"], map[string]any{"type": "out", "scope": "marketing", "ref": "req-7"})
	br := newBrowser(t, logged.HTTP.URL)
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	csrf := br.csrf("/ui/tenants/acme")
	p := br.do("POST", "/ui/tenants/acme/recipient", url.Values{"csrf": {csrf}, "recipient": {"+1 (415) 555-0100"}})
	p.body = html.UnescapeString(p.body)
	if p.status != 200 || !strings.Contains(p.body, "Recipient +1415***0100") || !strings.Contains(p.body, `data-window="sms:recipient:60000" data-used="1"`) ||
		!strings.Contains(p.body, "1 queued") || !strings.Contains(p.body, `<li data-mark="opted out of marketing">`) ||
		!regexp.MustCompile(`<tr data-event="out"><td>[^<]+</td><td>out</td><td>marketing</td><td>api</td><td></td><td></td><td>req-7</td></tr>`).MatchString(p.body) {
		t.Fatalf("lookup: %d %s", p.status, p.body)
	}
	for _, clear := range []string{"14155550100", "415) 555", "5550100", "5550111"} {
		if strings.Contains(p.body, clear) {
			t.Fatalf("the page shows %q", clear)
		}
	}
	// Without a CSRF token there is no lookup.
	if p := br.do("POST", "/ui/tenants/acme/recipient", url.Values{"recipient": {"+14155550100"}}); p.status != http.StatusForbidden {
		t.Fatalf("lookup without CSRF token: %d", p.status)
	}
	// Bad input gets a clear message, without echoing it back.
	p = br.do("POST", "/ui/tenants/acme/recipient", url.Values{"csrf": {csrf}, "recipient": {"0415 5550 999"}})
	if p.status != http.StatusBadRequest || !strings.Contains(p.body, "E.164") || strings.Contains(p.body, "5550 999") {
		t.Fatalf("bad recipient: %d %s", p.status, p.body)
	}
	if l := logs.String(); strings.Contains(l, "5550100") || strings.Contains(l, "5550 999") || !strings.Contains(l, `"route":"POST /ui/tenants/{tenant}/recipient"`) {
		t.Fatalf("the log shows the recipient, or not the request: %s", l)
	}
}

// The chart is a well-formed standalone SVG with a bar per minute that had
// sends and a line per tenant-wide rule.
func TestUIChartIsSVG(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	fill(t, b, "acme", "sms:tenant", "1000/1h", "", 5)
	br := newBrowser(t, b.HTTP.URL)
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	p := br.get("/ui/tenants/acme/chart.svg?channel=sms")
	if p.status != 200 || p.header.Get("Content-Type") != "image/svg+xml" {
		t.Fatalf("chart: %d %q", p.status, p.header.Get("Content-Type"))
	}
	dec := xml.NewDecoder(strings.NewReader(p.body))
	var rects, dashed int
	var title string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v: %s", err, p.body)
		}
		if se, ok := tok.(xml.StartElement); ok {
			for _, a := range se.Attr {
				if se.Name.Local == "rect" && a.Name.Local == "fill" && (a.Value == "#7fa7d6") {
					rects++
				}
				if se.Name.Local == "line" && a.Name.Local == "stroke-dasharray" {
					dashed++
				}
			}
			if se.Name.Local == "title" && title == "" {
				var s string
				if err := dec.DecodeElement(&s, &se); err != nil {
					t.Fatal(err)
				}
				title = s
			}
		}
	}
	// The five sends were made within a second: one or two minute buckets.
	if rects < 1 || rects > 2 || dashed != 1 || title != "SMS sends, last hour" || !strings.Contains(p.body, "5 sent in the hour · window 5 / 1000") {
		t.Fatalf("chart: %d bars, %d limit lines, title %q: %s", rects, dashed, title, p.body)
	}
	if p := br.get("/ui/tenants/acme/chart.svg?channel=fax"); p.status != http.StatusBadRequest {
		t.Fatalf("bad channel: %d", p.status)
	}
}

// The live stream sends the windows table as an event every second; a send
// shows in the next one.
func TestUILiveStreamFollowsTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	br := newBrowser(t, b.HTTP.URL)
	br.login(b.Tokens["acme"], "/ui/tenants/acme")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.HTTP.URL+"/ui/tenants/acme/live", nil)
	br.c.Timeout = 0
	resp, err := br.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Content-Security-Policy") != wantCSP {
		t.Fatalf("stream: %d %v", resp.StatusCode, resp.Header)
	}
	events := readEvents(resp.Body)
	next := func() (string, string) {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			return ev[0], ev[1]
		case <-ctx.Done():
			t.Fatal("no event in time")
		}
		return "", ""
	}
	name, data := next()
	if name != "windows" || !strings.Contains(data, `data-window="sms:tenant:3600000" data-used="0"`) || strings.Contains(data, "Reset") {
		t.Fatalf("first event %q: %s", name, data)
	}
	fill(t, b, "acme", "sms:tenant", "1000/1h", "", 2)
	for !strings.Contains(data, `data-window="sms:tenant:3600000" data-used="2"`) {
		if name, data = next(); name != "windows" {
			t.Fatalf("event %q", name)
		}
	}
}

// readEvents parses a server-sent event stream into (name, data) pairs.
func readEvents(r io.Reader) <-chan [2]string {
	out := make(chan [2]string, 16)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var name string
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if name != "" {
					out <- [2]string{name, strings.Join(data, "\n")}
				}
				name, data = "", nil
			case strings.HasPrefix(line, "event: "):
				name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				data = append(data, line[len("data: "):])
			}
		}
	}()
	return out
}

// A waiting message shows the deadline the worker holds it to: the latest
// slot that still reaches the provider by its expires_at, i.e. expires_at
// less SLUICE_SEND_SLACK (plans.Check.SendBy). One whose expires_at is 30 s
// ahead has had its last slot pass half a minute ago with a slack of a
// minute; one expiring in an hour and 30 s has under an hour left to be
// sent: both are listed as expiring, the first as past due.
func TestUIDeadlineIsTheWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, map[string]string{"SLUICE_SEND_SLACK": "1m"})
	client := asynq.NewClientFromRedisClient(b.RDB)
	t.Cleanup(func() { client.Close() })
	now := time.Now().UTC()
	for i, expires := range []time.Duration{30 * time.Second, time.Hour + 30*time.Second, 3 * time.Hour} {
		n := tasks.Notification{Tenant: "acme", Channel: tasks.SMS, To: "+1415555010" + strconv.Itoa(i), Body: "hi",
			ExpiresAt: now.Add(expires), EnqueuedAt: now}
		q := b.API.Services().Plans.Policy().Queue(b.Config.Layout(), n)
		if _, err := tasks.Enqueue(context.Background(), client, b.Keys, n, asynq.Queue(q), asynq.ProcessIn(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	admin := newBrowser(t, b.HTTP.URL)
	admin.login(adminToken, "/ui")
	p := admin.get("/ui/tenants/acme")
	row := regexp.MustCompile(`<tr data-reason="expiry_soon"[^>]*>.*?<td class="num">(\d+)</td><td>first ([^<]*)</td></tr>`).FindStringSubmatch(p.body)
	if p.status != 200 || row == nil {
		t.Fatalf("no expiring row on acme's page (%d): %s", p.status, p.body)
	}
	if row[1] != "2" || !regexp.MustCompile(`^3\d(\.\d)?s ago$`).MatchString(row[2]) {
		t.Fatalf("expiring: %s, the first %q; want 2, the first about 30s ago (expires_at − SLUICE_SEND_SLACK)", row[1], row[2])
	}
}

// A Backend without a part the dashboard needs is an error naming it, not
// a panic on the first page.
func TestNewNeedsACompleteBackend(t *testing.T) {
	t.Parallel()
	_, err := dashboard.New(dashboard.Backend{Log: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, dashboard.ErrBackend) || !strings.Contains(err.Error(), "Limiter, Plans, PlanStore, Queues, Auth") {
		t.Fatalf("New with a bare backend: %v", err)
	}
}

// The overview lists the providers whose breakers are open (down), with
// since when, and says so when every one is up.
func TestUIOverviewShowsProvidersDown(t *testing.T) {
	t.Parallel()
	b := setup(t, uiRules, nil)
	admin := newBrowser(t, b.HTTP.URL)
	admin.login(adminToken, "/ui")
	if p := admin.get("/ui"); p.status != 200 || !strings.Contains(p.body, "Every provider is up") {
		t.Fatalf("overview with every provider up: %d %s", p.status, p.body)
	}
	lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(b.Config.SubjectSecret), CompactMembers: b.Config.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	p := throttle.BreakerPolicy{Failures: 1, Window: time.Minute, Cooldown: time.Minute}
	if _, err := lim.ProviderFailed(context.Background(), lim.BreakerKey("sms", "primary"), p); err != nil {
		t.Fatal(err)
	}
	if page := admin.get("/ui"); page.status != 200 || !strings.Contains(page.body, `data-provider="sms:primary"`) || !strings.Contains(page.body, ">down<") {
		t.Fatalf("overview with sms:primary down: %d %s", page.status, page.body)
	}
}
