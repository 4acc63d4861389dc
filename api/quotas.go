package api

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/sluicehq/sluice/report"
	"github.com/sluicehq/sluice/tasks"
)

// getQuotas is GET /v1/quotas: the tenant's windows — and, with recipient,
// the recipient's — under the rules in force, exactly as `sluice quota show
// --json` prints them. The recipient is only hashed (as the limiter keys
// it) and masked in errors; it is never logged or stored.
func (s *Server) getQuotas(w http.ResponseWriter, r *http.Request) {
	tenant, ok := s.tenantOf(w, r, identityOf(r))
	if !ok {
		return
	}
	q := r.URL.Query()
	query := report.QuotaQuery{Tenant: tenant, Channel: tasks.Channel(q.Get("channel")),
		Category: q.Get("category"), Recipient: q.Get("recipient"), From: q.Get("from")}
	var bad []InvalidParam
	for name := range q {
		switch name {
		case "tenant", "channel", "category", "recipient", "from":
			if len(q[name]) > 1 {
				bad = append(bad, InvalidParam{Name: name, Reason: "is given more than once"})
			}
		default:
			bad = append(bad, InvalidParam{Name: name, Reason: "is not a parameter of /v1/quotas (tenant, channel, category, recipient, from)"})
		}
	}
	bad = append(bad, quotaParams(q)...)
	if len(bad) > 0 {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "bad query parameters", bad...)
		return
	}
	rep, err := report.Quotas(r.Context(), s.lim, s.policy(), s.cfg, query)
	switch {
	case errors.Is(err, report.ErrNoRules):
		writeProblem(w, http.StatusUnprocessableEntity, "no-rules", "no rule applies: tenant-wide rules need SLUICE_RULES or a plan, recipient rules a recipient, sender rules a sender")
		return
	case errors.Is(err, tasks.ErrInvalid):
		writeProblem(w, http.StatusBadRequest, "invalid-request", "bad query parameters", InvalidParam{Name: "tenant", Reason: fieldReason(err)})
		return
	case err != nil:
		s.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rep.JSON())
}

// quotaParams checks each parameter given against openapi.yaml's schema
// for it, exactly: a value the document refuses is refused (400), an
// empty one included.
func quotaParams(q url.Values) []InvalidParam {
	var bad []InvalidParam
	if v, ok := q["channel"]; ok && v[0] != string(tasks.Email) && v[0] != string(tasks.SMS) && v[0] != string(tasks.WhatsApp) {
		bad = append(bad, InvalidParam{Name: "channel", Reason: "must be email, sms or whatsapp (or absent: all)"})
	}
	if v, ok := q["category"]; ok {
		if err := tasks.CheckCategory(v[0]); err != nil {
			bad = append(bad, InvalidParam{Name: "category", Reason: fieldReason(err)})
		}
	}
	if v, ok := q["from"]; ok && !fromRe.MatchString(v[0]) {
		bad = append(bad, InvalidParam{Name: "from", Reason: "must be 1 to 254 printable ASCII characters: a number, an address or a Messaging Service SID"})
	}
	if v, ok := q["recipient"]; ok && !quotaRecipient(v[0]) {
		// A '+' sent bare in a query string arrives as a space: the number
		// would be looked up without it and every window read as empty.
		bad = append(bad, InvalidParam{Name: "recipient", Reason: "is neither a bare address nor an E.164 number (send '+' as %2B in a query string)"})
	}
	return bad
}
