package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// Every path of the OpenAPI document, with every method: those the
// document lists are served (never 405), every other one is answered 405
// with an Allow header naming exactly the document's methods (and HEAD
// with GET) — the webhook, Telnyx and callback routes mounted beside the
// API's own included (issue 53: they answered 404 without Allow).
func TestEveryRouteAnswersOtherMethodsWith405(t *testing.T) {
	t.Parallel()
	srv, _ := redistest.New(t)
	cfg, err := api.ParseConfig(map[string]string{
		"SLUICE_REDIS_URL":      srv.URL(),
		"SLUICE_SUBJECT_SECRET": "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":   tasks.NewKeySpec("methods"),
		"SLUICE_API_TOKEN_KEY":  "token-key-0123456789abcdef0123456789",
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := app.NewAPI(cfg, map[string]string{}, app.APIOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	params := strings.NewReplacer("{tenant}", "acme", "{id}", "n-1", "{recipient}", "+14155550100", "{token}", "tok", "{channel}", "sms")
	all := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}
	paths := doc.Paths.InMatchingOrder()
	sort.Strings(paths)
	if len(paths) < 20 {
		t.Fatalf("%d paths in the document", len(paths))
	}
	failing := 0
	for _, p := range paths {
		var want []string
		for m := range doc.Paths.Find(p).Operations() {
			want = append(want, m)
			if m == "GET" {
				want = append(want, "HEAD")
			}
		}
		path := params.Replace(p)
		for _, m := range all {
			req := httptest.NewRequestWithContext(context.Background(), m, path, nil)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if slices.Contains(want, m) {
				if rec.Code == http.StatusMethodNotAllowed {
					failing++
					t.Errorf("%s %s: 405, but the document lists it", m, p)
				}
				continue
			}
			allow := strings.Split(rec.Header().Get("Allow"), ", ")
			if rec.Code != http.StatusMethodNotAllowed || !sameSet(allow, want) {
				failing++
				t.Errorf("%s %s: %d, Allow %q; want 405, Allow %v", m, p, rec.Code, rec.Header().Get("Allow"), want)
			}
		}
	}
	t.Logf("%d paths × %d methods: %d failing", len(paths), len(all), failing)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
