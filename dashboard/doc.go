// Package dashboard is Sluice's web dashboard, served by `sluice api` at
// /ui: server-rendered pages with their templates, stylesheet and script
// embedded, usable without JavaScript (with it, the figures update every
// second over server-sent events). Browsers sign in with an API token —
// the admin's sees every tenant, a tenant's its own tenant only.
//
// # Pages
//
// Every route the dashboard mounts, one line each (methods, paths, what it
// shows; ANY is a pattern without a method), kept equal to what it
// registers by TestRoutesDoc in app:
//
//	GET  /ui                          the admin's overview: every tenant's plan and tenant-wide windows, queue depths, what waits or was lost
//	GET  /ui/tenant?tenant=…          the overview's "open a tenant" form: to that tenant's page
//	GET  /ui/tenants/{tenant}         a tenant: plan and recent changes, windows (live), a chart per channel, messages waiting by reason, denials, drops, expiries
//	GET  /ui/tenants/{tenant}/chart.svg?channel=sms|email   the last hour's sends per minute and how the longest window filled, as SVG drawn here
//	POST /ui/tenants/{tenant}/recipient  a recipient's windows, quiet hours and messages, its consent and ledger (posted: never in a URL or a log; shown masked)
//	GET, POST /ui/tenants/{tenant}/reset  the admin resets one tenant-wide window, after a confirmation page
//	GET  /ui/live, /ui/tenants/{tenant}/live  the live figures (text/event-stream)
//	GET, POST /ui/login               sign in with an API token
//	POST /ui/logout                   sign out (the session ends server-side)
//	GET  /ui/static/{file}            the embedded stylesheet and script (mounted bare: no access log, no metrics)
//	ANY  /ui/                         anything else: /ui/ itself redirects to /ui, the rest is a page saying there is no such page
//
// # What it depends on
//
// A Backend, and nothing else: the limiter (windows through report.Quotas,
// the chart through throttle.Limiter.Series, resets), the rules in force
// and the plan store, Asynq's inspector (the tasks it holds), the payload
// keys, and an Auth that checks tokens as the API does (*api.Auth). It
// holds no Redis client, builds no key and parses no stored value: the
// packages that own them do. The deadline a waiting message shows is the
// one the worker holds it to (plans.Planner, less SLUICE_SEND_SLACK).
// The package does not import api; app, which builds the API
// process `sluice api` runs, wires the two:
//
//	d, err := dashboard.New(dashboard.NewBackend(cfg.Base, srv.Services(), srv.Auth(), srv.Stopping))
//	d.Mount(srv) // behind the API's access log and metrics; the static files bare
//
// # Sessions and safety
//
// A sign-in is checked once and kept as a signed cookie (HMAC-SHA256 under
// a key derived from SLUICE_API_TOKEN_KEY and the admin token: changing
// either signs every browser out), HttpOnly, SameSite=Strict, Secure over
// TLS and behind a proxy that says it took https (X-Forwarded-Proto,
// Forwarded), valid 12 hours; a revoked token ends its sessions at the next
// request, and signing out ends the session server-side (Auth.EndSession:
// the cookie, replayed, is refused until it would expire). The cookie
// never holds the token. Failed sign-ins are limited per client address
// (Auth.Locked and Failed: SLUICE_API_AUTH_FAILURES, shared with /v1);
// only failures count, so a valid token from another client is never
// refused. Every signed-in request counts against its token's
// SLUICE_API_RATE (Auth.Allow). Live streams are shared fairly: 64 per
// server, 8 of them the admin's only, 8 per tenant, 2 per session. Every state-changing
// form carries a CSRF token and is refused from another site; every answer
// carries a strict Content-Security-Policy (no inline script or style) and
// denies framing. A tenant's sign-in gets 403, naming nothing, on another
// tenant's pages.
package dashboard
