package dashboard_test

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// chromiumHint tells a developer how to get the browser the dashboard test needs.
const chromiumHint = "install Chromium (Debian/Ubuntu: `sudo apt-get install chromium`) or run ./scripts/test.sh, which installs it where it can, " +
	"or set SLUICE_CHROMIUM to a Chrome or Chromium binary"

// chromium finds the browser, or fails the test saying how to install it.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the dashboard's browser test needs Chromium, and none is on PATH (tried chromium, chromium-browser, google-chrome): " + chromiumHint)
	return ""
}

// newChromium starts one headless Chromium for the test, with a fresh
// profile and nothing that reaches out to the network by itself.
func newChromium(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancel)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		t.Fatalf("start Chromium: %v; %s", err, chromiumHint)
	}
	return bctx
}

// tab opens a tab in a browser context of its own (its own cookies).
func tab(t *testing.T, browser context.Context, opts ...chromedp.ContextOption) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser, append([]chromedp.ContextOption{chromedp.WithNewBrowserContext()}, opts...)...)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// stepTimeout bounds each browser step: a wait for a DOM condition fails
// after it instead of using up the test's whole budget.
// 60 s: beside two CPU hogs Chromium took over 20 s to render a page.
const stepTimeout = 60 * time.Second

// must runs steps, failing the test with what was being done.
func must(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// follow runs steps that load a page (a click on a link or a button) and
// returns the page's response once it has loaded.
func follow(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) *network.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, steps...)
	// A live view replaces its rows as it refreshes: a node found just
	// before may be gone by the click ("Could not find node with given
	// id"). The next try finds its replacement.
	for try := 0; try < 3 && err != nil && strings.Contains(err.Error(), "Could not find node"); try++ {
		resp, err = chromedp.RunResponse(ctx, steps...)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return resp
}

// signIn fills the login form with token and waits for the page it leads to.
func signIn(t *testing.T, ctx context.Context, base, token, wantPath string) {
	t.Helper()
	must(t, ctx, "open the dashboard", chromedp.Navigate(base+"/ui"))
	if loc := get(t, ctx, "location", chromedp.Location()); !strings.Contains(loc, "/ui/login") {
		t.Fatalf("signed out, /ui shows %s", loc)
	}
	must(t, ctx, "type the token", chromedp.SendKeys(chromedp.ID("token"), token))
	resp := follow(t, ctx, "sign in", chromedp.Click(chromedp.CSS(`form button[type=submit]`)))
	if loc := get(t, ctx, "location", chromedp.Location()); resp.Status != 200 || loc != base+wantPath {
		t.Fatalf("signed in: %d at %s, want %s", resp.Status, loc, wantPath)
	}
}

// pageHTML is the page's current DOM.
func pageHTML(t *testing.T, ctx context.Context) string {
	t.Helper()
	return get(t, ctx, "read the page", chromedp.OuterHTML(chromedp.CSS("html")))
}

// screenshot takes a full-page PNG and checks it. It writes it to
// docs/NAME for the README when that file is missing or when
// SLUICE_UPDATE_SCREENSHOTS=1, so a test run leaves the tree clean.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	buf := get(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	cfg, err := png.DecodeConfig(bytes.NewReader(buf))
	if err != nil || cfg.Width != 1280 || cfg.Height < 600 {
		t.Fatalf("screenshot %s: %v, %dx%d", name, err, cfg.Width, cfg.Height)
	}
	path := filepath.Join("..", "docs", name)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) || os.Getenv("SLUICE_UPDATE_SCREENSHOTS") == "1" {
		if err := os.WriteFile(path, buf, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%dx%d)", path, cfg.Width, cfg.Height)
	}
}

// The dashboard in a real browser: sign in with a token, watch a tenant's
// usage change while notifications are enqueued (live, without a reload),
// look up a recipient, reset a window after confirming, see that a tenant
// token cannot see another tenant, and use the read-only views with
// JavaScript disabled.
func TestDashboardInBrowser(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=1/1m,sms:tenant=20/1h,email:tenant=2/1h drop", map[string]string{
		"SLUICE_DELAYED_CHECK_INTERVAL": "100ms", "SLUICE_POLL_INTERVAL": "50ms"})
	b.RunWorker(t, app.WorkerOptions{})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	browser := newChromium(t, ctx)
	base := b.HTTP.URL
	acme := b.Tokens["acme"]
	enqueue := func(n map[string]any) {
		t.Helper()
		if r := b.Do(t, "POST", "/v1/notifications", acme, n); r.Status != 202 {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
	}

	// An hour of earlier sends in acme's SMS window, admitted at their own
	// instants by a limiter on a clock set back (throttle.Options.Now), so
	// the chart has a history to draw.
	for _, ago := range []time.Duration{52, 47, 41, 40, 33, 25, 18, 11, 6} {
		at := time.Now().Add(-ago * time.Minute)
		lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(b.WorkerConfig.SubjectSecret), CompactMembers: b.WorkerConfig.CompactMembers,
			Direct: true, Now: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := lim.Allow(ctx, "acme", tasks.NewID(), throttle.Limit{Scope: "sms:tenant", Rule: throttle.PerHour(20)}); err != nil || !d.Allowed {
			t.Fatalf("seed a send %v ago: %+v %v", ago, d, err)
		}
		lim.Close()
	}

	t.Run("LiveUsage", func(t *testing.T) {
		admin := tab(t, browser)
		signIn(t, admin, base, adminToken, "/ui")
		must(t, admin, "the overview lists acme", chromedp.WaitVisible(chromedp.CSS(`#live-tenants tr[data-tenant="acme"]`)))
		resp := follow(t, admin, "open acme", chromedp.Click(chromedp.CSS(`#live-tenants a[href="/ui/tenants/acme"]`)))
		if resp.Status != 200 {
			t.Fatalf("acme's page: %d", resp.Status)
		}
		must(t, admin, "the stream connects",
			chromedp.WaitVisible(chromedp.CSS(`#live-windows tr[data-window="sms:tenant:3600000"][data-used="9"]`)),
			chromedp.WaitReady(chromedp.CSS(`#live-status[data-state="on"]`)))
		// A mark on this very document: a reload would lose it.
		if _, err := chromedp.Run(admin, chromedp.Evaluate[any](`window.sluiceMark = "same page"`)); err != nil {
			t.Fatal(err)
		}
		for _, to := range []string{"+14155550100", "+14155550101", "+14155550102"} {
			enqueue(apienv.NewSMS(to, "hello"))
		}
		must(t, admin, "usage shows the three sends",
			chromedp.WaitVisible(chromedp.CSS(`#live-windows tr[data-window="sms:tenant:3600000"][data-used="12"]`)))
		if mark := get(t, admin, "the mark", chromedp.Evaluate[string](`window.sluiceMark`)); mark != "same page" {
			t.Fatalf("the page was reloaded (mark %q)", mark)
		}
		bar := get(t, admin, "the bar", chromedp.AttributeValue(chromedp.CSS(`#live-windows tr[data-window="sms:tenant:3600000"] rect.bar-used`), "width"))
		if bar.Value != "60.00" {
			t.Fatalf("the bar of 12 of 20 is %q wide, want 60.00", bar.Value)
		}

		// Something to wait, be dropped and expire: a second SMS to one
		// number waits a minute for its slot (1/1m), a third with a 5 s
		// deadline cannot make it and expires, and the third email
		// overflows a drop rule of 2/1h.
		enqueue(apienv.NewSMS("+14155550100", "second"))
		expiring := apienv.NewSMS("+14155550100", "third")
		expiring["ttl"] = "5s"
		enqueue(expiring)
		for _, to := range []string{"ann@example.com", "bob@example.com", "cy@example.com"} {
			enqueue(map[string]any{"channel": "email", "to": to, "subject": "Hi", "body": "hello"})
		}
		sluicetest.Eventually(t, 20*time.Second, "one message waiting and two archived", func() bool {
			var retry, archived int
			for _, ti := range b.Queued(t) {
				switch ti.State {
				case asynq.TaskStateRetry:
					retry++
				case asynq.TaskStateArchived:
					archived++
				}
			}
			return retry == 1 && archived == 2
		})
		must(t, admin, "reload acme's page", chromedp.Navigate(base+"/ui/tenants/acme"),
			chromedp.WaitVisible(chromedp.CSS(`table.lost tr[data-reason="dropped"]`)),
			chromedp.WaitVisible(chromedp.CSS(`table.lost tr[data-reason="expired"]`)),
			chromedp.WaitVisible(chromedp.CSS(`table.reasons tr[data-reason="throttled"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#live-windows tr[data-window="email:tenant:3600000"][data-used="2"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#live-status[data-state="on"]`)))
		page := pageHTML(t, admin)
		for _, want := range []string{"sms:recipient 1/1m", "+1415***0100", "dropped (drop rule full)", "expired unsent"} {
			if !strings.Contains(page, want) {
				t.Errorf("acme's page lacks %q", want)
			}
		}
		if strings.Contains(page, "4155550100") || strings.Contains(page, "ann@example.com") {
			t.Error("acme's page shows a recipient in clear")
		}
		screenshot(t, admin, "dashboard.png")
		must(t, admin, "the overview", chromedp.Navigate(base+"/ui"),
			chromedp.WaitVisible(chromedp.CSS(`#live-tenants li[data-window="sms:tenant:3600000"][data-used="12"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#live-queues tr[data-lane="priority"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#live-queues tr[data-lane="standard"][data-busy]`)))
		screenshot(t, admin, "dashboard-overview.png")

		t.Run("RecipientLookup", func(t *testing.T) {
			must(t, admin, "acme's page", chromedp.Navigate(base+"/ui/tenants/acme"),
				chromedp.SendKeys(chromedp.ID("recipient"), "+1 415 555 0100"))
			resp := follow(t, admin, "look up", chromedp.Click(chromedp.CSS(`form[action$="/recipient"] button`)))
			// The number must not be in the address (a GET would log it);
			// the host's port is left out: it may hold 555 by chance.
			if u, err := url.Parse(resp.URL); err != nil || resp.Status != 200 || strings.Contains(u.RequestURI(), "555") {
				t.Fatalf("lookup: %d at %s", resp.Status, resp.URL)
			}
			if h1 := get(t, admin, "heading", chromedp.Text(chromedp.CSS("h1"))); !strings.HasPrefix(h1, "Recipient +1415***0100") {
				t.Fatalf("lookup heading %q", h1)
			}
			// Sent once, one booked slot in its 1/1m window, one message waiting.
			must(t, admin, "the recipient's window",
				chromedp.WaitVisible(chromedp.CSS(`tr[data-window="sms:recipient:60000"][data-used="1"][data-booked="1"]`)),
				chromedp.WaitVisible(chromedp.CSS(`table.reasons tr[data-reason="throttled"]`)),
				chromedp.WaitVisible(chromedp.CSS(`table.lost tr[data-reason="expired"]`)))
			if page := pageHTML(t, admin); strings.Contains(page, "4155550100") || strings.Contains(page, "555 0100") {
				t.Fatal("the lookup page shows the recipient in clear")
			}
			screenshot(t, admin, "dashboard-recipient.png")
		})

		t.Run("ResetAsksAndWorks", func(t *testing.T) {
			must(t, admin, "acme's page", chromedp.Navigate(base+"/ui/tenants/acme"),
				chromedp.WaitVisible(chromedp.CSS(`#live-windows tr[data-window="sms:tenant:3600000"][data-used="12"]`)))
			// The live stream re-renders the table: a row found may be replaced
			// before the click lands ("Could not find node"); find it again.
			var resp *network.Response
			for attempt := 0; resp == nil; attempt++ {
				ctx, cancel := context.WithTimeout(admin, stepTimeout)
				r, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`tr[data-window="sms:tenant:3600000"] a.reset`)))
				cancel()
				if err != nil && (attempt == 2 || !strings.Contains(err.Error(), "Could not find node")) {
					t.Fatalf("click reset: %v", err)
				}
				resp = r
			}
			question := get(t, admin, "the question", chromedp.Text(chromedp.CSS("main")))
			if resp.Status != 200 || !strings.Contains(question, "Reset the window sms:tenant 20/1h of tenant acme?") {
				t.Fatalf("no confirmation asked (%d): %s", resp.Status, question)
			}
			if n := usedIn(t, b, "acme", "sms:tenant", "20/1h"); n != 12 {
				t.Fatalf("the window changed before confirming: used %d", n)
			}
			resp = follow(t, admin, "confirm", chromedp.Click(chromedp.ID("confirm-reset")))
			if loc := get(t, admin, "location", chromedp.Location()); resp.Status != 200 || !strings.Contains(loc, "/ui/tenants/acme?reset=") {
				t.Fatalf("after confirming: %d at %s", resp.Status, loc)
			}
			must(t, admin, "the window is empty",
				chromedp.WaitVisible(chromedp.CSS(`.flash`)),
				chromedp.WaitVisible(chromedp.CSS(`#live-windows tr[data-window="sms:tenant:3600000"][data-used="0"]`)))
			if n := usedIn(t, b, "acme", "sms:tenant", "20/1h"); n != 0 {
				t.Fatalf("after the reset: used %d", n)
			}
		})
	})

	t.Run("TenantSeesItselfOnly", func(t *testing.T) {
		globex := tab(t, browser)
		signIn(t, globex, base, b.Tokens["globex"], "/ui/tenants/globex")
		if page := pageHTML(t, globex); strings.Contains(page, "acme") {
			t.Fatal("globex's page names acme")
		}
		for _, path := range []string{"/ui/tenants/acme", "/ui/tenants/acme/chart.svg?channel=sms", "/ui/tenants/acme/reset?window=sms:tenant:3600000"} {
			resp := get(t, globex, "open "+path, chromedp.NavigateResponse(base+path))
			if resp.Status != 403 {
				t.Errorf("%s as globex: %d, want 403", path, resp.Status)
			}
			if text := get(t, globex, "read", chromedp.OuterHTML(chromedp.CSS("body"))); strings.Contains(text, "acme") || strings.Contains(text, "0100") {
				t.Errorf("%s as globex shows acme's data: %s", path, text)
			}
		}
		resp := get(t, globex, "open /ui", chromedp.NavigateResponse(base+"/ui"))
		if loc := get(t, globex, "location", chromedp.Location()); resp.Status != 200 || loc != base+"/ui/tenants/globex" {
			t.Fatalf("globex at /ui: %d at %s", resp.Status, loc)
		}
	})

	t.Run("WithoutJavaScript", func(t *testing.T) {
		noJS := tab(t, browser)
		must(t, noJS, "disable JavaScript", chromedp.Func(func(ctx context.Context, tt *chromedp.Target) error {
			_, err := cdp.Call(ctx, tt, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
			return err
		}))
		signIn(t, noJS, base, acme, "/ui/tenants/acme")
		must(t, noJS, "the read-only views render",
			chromedp.WaitVisible(chromedp.CSS(`#live-windows tr[data-window="sms:tenant:3600000"]`)),
			chromedp.WaitVisible(chromedp.CSS(`img[src="/ui/tenants/acme/chart.svg?channel=sms"]`)),
			chromedp.WaitVisible(chromedp.CSS(`table.lost tr[data-reason="dropped"]`)))
		// The script did not run: the status still says how to refresh by hand.
		if status := get(t, noJS, "live status", chromedp.Text(chromedp.ID("live-status"))); !strings.Contains(status, "reload") {
			t.Fatalf("live status without JavaScript: %q", status)
		}
		must(t, noJS, "look up without JavaScript", chromedp.SendKeys(chromedp.ID("recipient"), "+14155550101"))
		resp := follow(t, noJS, "look up", chromedp.Click(chromedp.CSS(`form[action$="/recipient"] button`)))
		if h1 := get(t, noJS, "heading", chromedp.Text(chromedp.CSS("h1"))); resp.Status != 200 || !strings.HasPrefix(h1, "Recipient +1415***0101") {
			t.Fatalf("lookup without JavaScript: %d %q", resp.Status, h1)
		}
		must(t, noJS, "its window", chromedp.WaitVisible(chromedp.CSS(`tr[data-window="sms:recipient:60000"][data-used="1"]`)))
	})
}
