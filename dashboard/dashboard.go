package dashboard

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

//go:embed templates/*.tmpl static/*
var uiFS embed.FS

const (
	uiCookie       = "sluice_ui"
	uiSessionTTL   = 12 * time.Hour
	uiLiveInterval = time.Second
	uiStreamMax    = 10 * time.Minute // a stream ends then; EventSource reconnects
	uiMaxForm      = 8 << 10
)

// uiCSP keeps every script, style and image to files this server serves.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

var (
	uiPages  map[string]*template.Template
	uiAssets = map[string]string{} // file name → content hash, for cache-busting URLs
	uiStatic fs.FS
)

func init() {
	var err error
	if uiStatic, err = fs.Sub(uiFS, "static"); err != nil {
		panic(err)
	}
	entries, err := fs.ReadDir(uiStatic, ".")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		b, _ := fs.ReadFile(uiStatic, e.Name())
		sum := sha256.Sum256(b)
		uiAssets[e.Name()] = hex.EncodeToString(sum[:6])
	}
	base := template.Must(template.New("").Funcs(uiFuncs).ParseFS(uiFS, "templates/layout.tmpl", "templates/parts.tmpl"))
	uiPages = map[string]*template.Template{}
	for _, name := range []string{"login", "overview", "tenant", "recipient", "reset", "error"} {
		t := template.Must(base.Clone())
		uiPages[name] = template.Must(t.ParseFS(uiFS, "templates/"+name+".tmpl"))
	}
}

// Dashboard serves the pages of one server, from its Backend.
type Dashboard struct {
	b       Backend
	planner plans.Planner // the worker's: zones, send slack, deadlines
	key     []byte        // signs sessions and CSRF tokens
	cop     *http.CrossOriginProtection
	streams *streamSlots
	// refusedWarn is when the last "streams all taken" warning was
	// logged (Unix ns): one every 10 s at most.
	refusedWarn atomic.Int64
}

// New builds the dashboard on b; Mount puts its routes on a server.
func New(b Backend) (*Dashboard, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if b.Stopping == nil {
		b.Stopping = func() bool { return false }
	}
	// The session key follows the token key and the admin token: changing
	// either signs every browser out.
	u := &Dashboard{b: b, planner: b.Settings.Planner(), key: b.Auth.SessionKey("sluice ui session"), cop: http.NewCrossOriginProtection(), streams: newStreamSlots(StreamCaps(b.MaxConns))}
	u.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, http.StatusForbidden, "This form was sent from another site; nothing was done.")
	}))
	return u, nil
}

// Mount adds the dashboard's routes, under /ui, to m.
func (u *Dashboard) Mount(m Mounter) {
	page := func(pattern string, h http.HandlerFunc) {
		m.Mount(pattern, u.headers(u.cop.Handler(h)))
	}
	signedIn := func(pattern string, h http.HandlerFunc) { page(pattern, u.session(h)) }
	tenantPage := func(pattern string, h func(http.ResponseWriter, *http.Request, string)) {
		signedIn(pattern, u.tenant(h))
	}
	page("GET /ui/login", u.loginForm)
	page("POST /ui/login", u.login)
	signedIn("POST /ui/logout", u.csrf(u.logout))
	signedIn("GET /ui", u.overview)
	signedIn("GET /ui/live", u.overviewLive)
	signedIn("GET /ui/tenant", u.openTenant)
	tenantPage("GET /ui/tenants/{tenant}", u.tenantPage)
	tenantPage("GET /ui/tenants/{tenant}/live", u.tenantLive)
	tenantPage("GET /ui/tenants/{tenant}/chart.svg", u.chart)
	tenantPage("POST /ui/tenants/{tenant}/recipient", u.withCSRF(u.recipient))
	tenantPage("GET /ui/tenants/{tenant}/reset", u.resetForm)
	tenantPage("POST /ui/tenants/{tenant}/reset", u.withCSRF(u.reset))
	m.MountBare("GET /ui/static/{file}", u.headers(http.HandlerFunc(u.static)))
	page("/ui/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ui/" {
			http.Redirect(w, r, "/ui", http.StatusSeeOther)
			return
		}
		u.fail(w, r, http.StatusNotFound, "There is no such page.")
	})
}

// headers sets the security headers of every dashboard answer.
func (u *Dashboard) headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", uiCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, "/ui/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

func (u *Dashboard) static(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if _, ok := uiAssets[name]; !ok {
		http.NotFound(w, r)
		return
	}
	if r.URL.Query().Get("v") == uiAssets[name] {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	http.ServeFileFS(w, r, uiStatic, name)
}

// uiSession is what the session cookie holds, signed: who signed in, with
// which token, until when. The token itself is not kept.
type uiSession struct {
	Admin   bool   `json:"a,omitempty"`
	Tenant  string `json:"t,omitempty"`
	TokenID string `json:"k"`
	Expires int64  `json:"e"`
	Nonce   string `json:"n"`
}

func (u *Dashboard) sign(b []byte) []byte {
	m := hmac.New(sha256.New, u.key)
	m.Write(b)
	return m.Sum(nil)
}

func (u *Dashboard) encodeSession(s uiSession) string {
	body, _ := json.Marshal(s)
	p := base64.RawURLEncoding.EncodeToString(body)
	return p + "." + base64.RawURLEncoding.EncodeToString(u.sign([]byte(p)))
}

func (u *Dashboard) decodeSession(v string, now time.Time) (uiSession, bool) {
	p, sig, ok := strings.Cut(v, ".")
	if !ok || len(v) > 1024 {
		return uiSession{}, false
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, u.sign([]byte(p))) {
		return uiSession{}, false
	}
	body, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return uiSession{}, false
	}
	var s uiSession
	if json.Unmarshal(body, &s) != nil || s.Nonce == "" || now.Unix() >= s.Expires || (!s.Admin && tasks.CheckTenant(s.Tenant) != nil) {
		return uiSession{}, false
	}
	return s, true
}

// csrfToken is the token every state-changing form of a session carries.
func (u *Dashboard) csrfToken(s uiSession) string {
	return base64.RawURLEncoding.EncodeToString(u.sign([]byte("csrf\x00" + s.Nonce))[:24])
}

type uiSessionKey struct{}

func sessionOf(r *http.Request) uiSession {
	s, _ := r.Context().Value(uiSessionKey{}).(uiSession)
	return s
}

// session admits requests of a signed-in browser whose token is still
// valid; others go to the login form (pages) or get 401 (streams, images).
func (u *Dashboard) session(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := u.current(w, r)
		if !ok {
			return
		}
		if log, ok := w.(interface{ SetIdentity(tenant, tokenID string) }); ok {
			log.SetIdentity(s.Tenant, s.TokenID) // the access log names the token
		}
		// The token's request budget (SLUICE_API_RATE), shared with the API.
		wait, allowed, err := u.b.Auth.Allow(r.Context(), s.TokenID)
		if err != nil {
			u.b.Log.Error("redis trouble; dashboard request refused", "route", r.Pattern, "err", err)
			u.fail(w, r, http.StatusServiceUnavailable, "Redis could not be asked; try again.")
			return
		}
		if !allowed {
			w.Header().Set("Retry-After", fmt.Sprint(max(1, int(wait.Seconds()+0.999))))
			u.fail(w, r, http.StatusTooManyRequests, "Too many requests for this token; wait a moment and reload.")
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), uiSessionKey{}, s)))
	}
}

// current reads the session of r, answering for it when there is none.
func (u *Dashboard) current(w http.ResponseWriter, r *http.Request) (uiSession, bool) {
	var s uiSession
	ok := false
	if c, err := r.Cookie(uiCookie); err == nil {
		s, ok = u.decodeSession(c.Value, time.Now())
	}
	if ok {
		valid, err := u.stillValid(r.Context(), s)
		if err != nil {
			u.b.Log.Error("redis trouble; dashboard request refused", "route", r.Pattern, "err", err)
			u.fail(w, r, http.StatusServiceUnavailable, "Redis could not be asked; try again.")
			return s, false
		}
		ok = valid
	}
	if ok {
		return s, true
	}
	u.clearCookie(w, r)
	if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, "/live") && !strings.HasSuffix(r.URL.Path, ".svg") {
		http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
		return s, false
	}
	u.fail(w, r, http.StatusUnauthorized, "Sign in first: your session ended or its token was revoked.")
	return s, false
}

// stillValid: the admin token is unchanged (the session key covers it) and
// a tenant token has not been revoked.
// A session signed out (logout) is refused until it expires.
func (u *Dashboard) stillValid(ctx context.Context, s uiSession) (bool, error) {
	ok, err := u.b.Auth.Valid(ctx, s.Tenant, s.TokenID)
	if err != nil {
		return false, fmt.Errorf("dashboard: session: %w", err)
	}
	if !ok {
		return false, nil
	}
	ended, err := u.b.Auth.Ended(ctx, s.Nonce)
	if err != nil {
		return false, fmt.Errorf("dashboard: session: %w", err)
	}
	return !ended, nil
}

// tenant admits a tenant's pages to the admin and to that tenant only.
// Another tenant gets 403 and a page that names nothing of the one asked for.
func (u *Dashboard) tenant(next func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t := r.PathValue("tenant")
		s := sessionOf(r)
		if tasks.CheckTenant(t) != nil {
			u.fail(w, r, http.StatusNotFound, "There is no such tenant.")
			return
		}
		if !s.Admin && t != s.Tenant {
			u.fail(w, r, http.StatusForbidden, "This sign-in sees tenant "+s.Tenant+" only.")
			return
		}
		next(w, r, t)
	}
}

// withCSRF checks the form's CSRF token before a state-changing handler.
func (u *Dashboard) withCSRF(next func(http.ResponseWriter, *http.Request, string)) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, t string) {
		if u.checkCSRF(w, r) {
			next(w, r, t)
		}
	}
}

func (u *Dashboard) csrf(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if u.checkCSRF(w, r) {
			next(w, r)
		}
	}
}

func (u *Dashboard) checkCSRF(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, uiMaxForm)
	if err := r.ParseForm(); err != nil {
		u.fail(w, r, http.StatusBadRequest, "The form could not be read.")
		return false
	}
	want := u.csrfToken(sessionOf(r))
	if got := r.PostForm.Get("csrf"); !hmac.Equal([]byte(got), []byte(want)) {
		u.fail(w, r, http.StatusForbidden, "The form's CSRF token is missing or stale; reload the page and try again. Nothing was done.")
		return false
	}
	return true
}

func (u *Dashboard) setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: value, Path: "/ui", MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil || forwardedHTTPS(r), SameSite: http.SameSiteStrictMode})
}

// forwardedHTTPS reports a request a TLS-terminating proxy forwarded
// (X-Forwarded-Proto: https, or Forwarded: proto=https): its cookie is
// Secure too. A client that sends the header itself only makes its own
// cookie stricter.
func forwardedHTTPS(r *http.Request) bool {
	for _, v := range r.Header.Values("X-Forwarded-Proto") {
		for _, p := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(p), "https") {
				return true
			}
		}
	}
	for _, v := range r.Header.Values("Forwarded") {
		for _, el := range strings.FieldsFunc(v, func(c rune) bool { return c == ',' || c == ';' }) {
			if k, val, ok := strings.Cut(strings.TrimSpace(el), "="); ok && strings.EqualFold(k, "proto") && strings.EqualFold(strings.Trim(val, `"`), "https") {
				return true
			}
		}
	}
	return false
}

func (u *Dashboard) clearCookie(w http.ResponseWriter, r *http.Request) {
	if _, err := r.Cookie(uiCookie); err == nil {
		u.setCookie(w, r, "", -1)
	}
}

// nextPath keeps a post-login redirect on this dashboard.
func nextPath(p string) string {
	if !strings.HasPrefix(p, "/ui") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") || strings.Contains(p, "/..") || len(p) > 256 {
		return "/ui"
	}
	return path.Clean(p)
}

func (u *Dashboard) loginForm(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(uiCookie); err == nil {
		if _, ok := u.decodeSession(c.Value, time.Now()); ok {
			http.Redirect(w, r, nextPath(r.URL.Query().Get("next")), http.StatusSeeOther)
			return
		}
	}
	u.render(w, r, http.StatusOK, "login", uiLogin{Next: nextPath(r.URL.Query().Get("next"))})
}

type uiLogin struct {
	Next  string
	Error string
}

// login checks a token as the API does and signs the browser in with it.
func (u *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, uiMaxForm)
	if err := r.ParseForm(); err != nil {
		u.fail(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	next := nextPath(r.PostForm.Get("next"))
	token := strings.TrimSpace(r.PostForm.Get("token"))
	// Failed sign-ins are limited per client (SLUICE_API_AUTH_FAILURES,
	// with /v1's): a client past it is refused before its token is
	// checked; only its own failures count against it.
	client := u.b.Auth.Client(r)
	wait, locked, err := u.b.Auth.Locked(r.Context(), client)
	if err != nil {
		u.b.Log.Error("redis trouble; login refused", "err", err)
		u.render(w, r, http.StatusServiceUnavailable, "login", uiLogin{Next: next, Error: "Redis could not be asked; try again."})
		return
	}
	if locked {
		w.Header().Set("Retry-After", fmt.Sprint(max(1, int(wait.Seconds()+0.999))))
		u.render(w, r, http.StatusTooManyRequests, "login", uiLogin{Next: next, Error: "Too many failed sign-ins from this address; wait a minute."})
		return
	}
	if token == "" {
		u.render(w, r, http.StatusUnauthorized, "login", uiLogin{Next: next, Error: "Enter an API token."})
		return
	}
	tenant, tokenID, ok, err := u.b.Auth.Identify(r.Context(), token)
	if err != nil {
		u.b.Log.Error("redis trouble; login refused", "err", err)
		u.render(w, r, http.StatusServiceUnavailable, "login", uiLogin{Next: next, Error: "Redis could not be asked; try again."})
		return
	}
	if !ok {
		if err := u.b.Auth.Failed(r.Context(), client); err != nil {
			u.b.Log.Error("redis trouble; failed sign-in not counted", "err", err)
		}
		u.render(w, r, http.StatusUnauthorized, "login", uiLogin{Next: next, Error: "That token is unknown or revoked."})
		return
	}
	s := uiSession{Admin: tenant == "", Tenant: tenant, TokenID: tokenID}
	if !s.Admin && next == "/ui" {
		next = "/ui/tenants/" + tenant
	}
	var n [16]byte
	_, _ = rand.Read(n[:])
	s.Nonce = base64.RawURLEncoding.EncodeToString(n[:])
	s.Expires = time.Now().Add(uiSessionTTL).Unix()
	u.setCookie(w, r, u.encodeSession(s), int(uiSessionTTL/time.Second))
	u.b.Log.Info("dashboard sign-in", "tenant", s.Tenant, "token_id", s.TokenID)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session server-side too: its cookie, replayed, is
// refused until it would have expired.
func (u *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	s := sessionOf(r)
	if err := u.b.Auth.EndSession(r.Context(), s.Nonce, time.Unix(s.Expires, 0)); err != nil {
		u.b.Log.Error("redis trouble; sign-out not recorded", "err", err)
		u.fail(w, r, http.StatusServiceUnavailable, "Redis could not be asked; you are still signed in. Try again.")
		return
	}
	u.streams.endSession(s.Nonce) // its live streams here end now; elsewhere at their next tick
	u.setCookie(w, r, "", -1)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// uiView is what every page's layout gets.
type uiView struct {
	Title   string
	Session uiSession
	Signed  bool
	CSRF    string
	Live    string // the event stream of the page; "" for none
	Page    any
}

func (u *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, name string, page any) {
	u.renderTitled(w, r, status, name, "", "", page)
}

func (u *Dashboard) renderTitled(w http.ResponseWriter, r *http.Request, status int, name, title, live string, page any) {
	t := uiPages[name]
	v := uiView{Title: title, Page: page, Live: live}
	if s, ok := r.Context().Value(uiSessionKey{}).(uiSession); ok {
		v.Session, v.Signed, v.CSRF = s, true, u.csrfToken(s)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		u.b.Log.Error("dashboard page did not render", "page", name, "err", err)
		http.Error(w, "the page did not render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type uiError struct {
	Status  int
	Message string
}

// fail answers with an error page (HTML) or, for a stream or an image, plain text.
func (u *Dashboard) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if strings.HasSuffix(r.URL.Path, "/live") || strings.HasSuffix(r.URL.Path, ".svg") {
		http.Error(w, msg, status)
		return
	}
	u.renderTitled(w, r, status, "error", http.StatusText(status), "", uiError{Status: status, Message: msg})
}

// unavailable answers a page that Redis could not serve.
func (u *Dashboard) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	u.b.Log.Error("redis trouble; dashboard request refused", "route", r.Pattern, "err", err)
	w.Header().Set("Retry-After", "1")
	u.fail(w, r, http.StatusServiceUnavailable, "Redis could not be asked; nothing was done, try again.")
}
