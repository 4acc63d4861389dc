package unsubscribe

import (
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// Mounter is where the routes go (api.Server's Mount).
type Mounter interface {
	Mount(pattern string, h http.Handler)
}

// Handler serves the one-click links.
type Handler struct {
	signer   *Signer
	store    *consent.Store
	policy   func() plans.Policy
	log      *slog.Logger
	recorded *prometheus.CounterVec
}

// New returns the handler. policy gives the rules in force (the scope of
// an opt-out: optout=all or category). reg, when set, gets
// sluice_unsubscribes_total.
func New(signer *Signer, store *consent.Store, policy func() plans.Policy, log *slog.Logger, reg prometheus.Registerer) *Handler {
	h := &Handler{signer: signer, store: store, policy: policy, log: log,
		recorded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_unsubscribes_total",
			Help: "One-click unsubscribe requests, by result (recorded, refused: a forged or altered link, invalid: not a one-click POST).",
		}, []string{"result"})}
	if reg != nil {
		reg.MustRegister(h.recorded)
	}
	return h
}

// Mount adds GET and POST /u/{token}.
func (h *Handler) Mount(m Mounter) {
	m.Mount("GET "+Path+"{token}", http.HandlerFunc(h.page))
	m.Mount("POST "+Path+"{token}", http.HandlerFunc(h.post))
}

// maxBody bounds a one-click POST's body ("List-Unsubscribe=One-Click").
const maxBody = 1 << 10

func headers(w http.ResponseWriter) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("Referrer-Policy", "no-referrer") // the token is the credential
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
}

// post records the opt-out: RFC 8058's one-click POST, no cookies, no
// confirmation.
func (h *Handler) post(w http.ResponseWriter, r *http.Request) {
	headers(w)
	l, err := h.signer.Parse(r.PathValue("token"))
	if err != nil {
		h.recorded.WithLabelValues("refused").Inc()
		h.answer(w, http.StatusNotFound, "This unsubscribe link is not valid", "Nothing was changed. If you copied the link, check that it is complete.")
		return
	}
	if !oneClick(w, r) {
		h.recorded.WithLabelValues("invalid").Inc()
		h.answer(w, http.StatusBadRequest, "Not an unsubscribe request", "A one-click unsubscribe sends List-Unsubscribe=One-Click as a form (RFC 8058). Nothing was changed.")
		return
	}
	scope := consent.Categories(l.Category)
	if h.policy().Consent(l.Tenant, tasks.Email).OptOut == plans.OptOutAll {
		scope = consent.AllCategories()
	}
	e, err := h.store.RecordHashed(r.Context(), l.Tenant, tasks.Email, l.Subject, consent.Event{
		Action: consent.OptOut, Source: consent.SourceOneClick, Scope: scope, Ref: "link." + l.Category})
	if err != nil {
		h.log.Error("one-click unsubscribe not recorded", "tenant", l.Tenant, "err", err)
		if errors.Is(err, consent.ErrInvalid) {
			h.answer(w, http.StatusBadRequest, "This unsubscribe link is not valid", "Nothing was changed.")
			return
		}
		w.Header().Set("Retry-After", "5")
		h.answer(w, http.StatusServiceUnavailable, "Please try again", "Your request could not be recorded just now. Nothing was changed; please try the link again in a moment.")
		return
	}
	h.recorded.WithLabelValues("recorded").Inc()
	h.log.Info("one-click unsubscribe recorded", "tenant", l.Tenant, "category", l.Category, "scope", e.Scope.String())
	h.answer(w, http.StatusOK, "You are unsubscribed", unsubscribedText(l.Category, scope))
}

// oneClick reports whether r's body is RFC 8058's List-Unsubscribe=One-Click,
// sent as multipart/form-data (what RFC 8058 says a mailbox provider SHOULD
// send) or application/x-www-form-urlencoded (what it MAY send), at most
// maxBody bytes.
func oneClick(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return false
	}
	switch mt {
	case "multipart/form-data":
		if err := r.ParseMultipartForm(maxBody); err != nil {
			return false
		}
		defer r.MultipartForm.RemoveAll()
	case "application/x-www-form-urlencoded":
		if err := r.ParseForm(); err != nil {
			return false
		}
	default:
		return false
	}
	v := r.PostForm["List-Unsubscribe"]
	return len(v) == 1 && v[0] == "One-Click"
}

func unsubscribedText(category string, scope consent.Scope) string {
	if scope.All {
		return "You will get no more email from this sender, except messages you ask for yourself (such as a sign-in code)."
	}
	return fmt.Sprintf("You will get no more email of this kind (%s) from this sender.", category)
}

// page is for a person who opens the link: one button that makes the
// one-click POST. It changes nothing itself (link scanners follow GETs).
func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	headers(w)
	if _, err := h.signer.Parse(r.PathValue("token")); err != nil {
		h.answer(w, http.StatusNotFound, "This unsubscribe link is not valid", "Nothing was changed. If you copied the link, check that it is complete.")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_ = confirmPage.Execute(w, nil)
}

func (h *Handler) answer(w http.ResponseWriter, status int, title, text string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_ = answerPage.Execute(w, struct{ Title, Text string }{title, text})
}

const style = `<style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem;line-height:1.5}button{font-size:1rem;padding:.5rem 1rem}</style>`

var confirmPage = template.Must(template.New("confirm").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width"><title>Unsubscribe</title>` + style + `</head>
<body><h1>Unsubscribe</h1><p>Stop getting these emails?</p>
<form method="post"><input type="hidden" name="List-Unsubscribe" value="One-Click"><button type="submit">Unsubscribe</button></form>
</body></html>
`))

var answerPage = template.Must(template.New("answer").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width"><title>{{.Title}}</title>` + style + `</head>
<body><h1>{{.Title}}</h1><p>{{.Text}}</p></body></html>
`))
