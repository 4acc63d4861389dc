package fakes

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// WhatsAppLimits are the limits Meta's Cloud API enforces, as the fake
// enforces them (0: not enforced).
type WhatsAppLimits struct {
	// Portfolio distinct users may get template messages in any Window
	// (Meta's messaging limit, shared by the portfolio's numbers: the
	// fake is one portfolio). A user counts from each message it is
	// delivered until Window after its latest.
	Portfolio int
	Window    time.Duration
	// PairCount messages from one number to one user in any PairWindow
	// (Meta's pair rate, about one per 6 s): error 131056.
	PairCount  int
	PairWindow time.Duration
	// Throughput messages per number in any second: error 130429.
	Throughput int
}

// The Cloud API's error codes the fake answers with.
const (
	WACodeThroughput   = 130429
	WACodePairRate     = 131056
	WACodeReengagement = 131047
)

// WhatsAppAPI is a fake of Meta's WhatsApp Cloud API: POST
// /{version}/{phone-number-id}/messages with a bearer token, templates and
// texts. It enforces Meta's limits itself — distinct users per window,
// the pair rate, throughput per number, the customer-service window (a
// text needs a message from the user in the last 24 h: Inbound) — and
// answers what breaks one with Meta's error code, counting each (a test's
// SetReply answers before them, with the code it returns); a
// template past the messaging limit is accepted and not delivered, as
// Meta documents, and counted (OverLimit). Every message it delivers is
// recorded: ID is its biz_opaque_callback_data (the notification id),
// From the phone-number id, Body the template's name or the text.
type WhatsAppAPI struct {
	*Recorder
	URL   string // base URL with a version: SLUICE_WHATSAPP_BASE_URL
	Token string

	mu        sync.Mutex
	limits    WhatsAppLimits
	latest    map[string]time.Time   // user → its latest template delivered
	pairs     map[string][]time.Time // number|user → deliveries
	numbers   map[string][]time.Time // number → deliveries
	inbound   map[string]time.Time   // user → its latest message to the business
	refused   map[int]int
	overLimit int
}

// NewWhatsAppAPI starts the fake on a loopback port; it stops when the test ends.
func NewWhatsAppAPI(tb testing.TB, limits WhatsAppLimits) *WhatsAppAPI {
	tb.Helper()
	f := &WhatsAppAPI{Recorder: newRecorder(), Token: "EAAG-fake-token", limits: limits, latest: map[string]time.Time{},
		pairs: map[string][]time.Time{}, numbers: map[string][]time.Time{}, inbound: map[string]time.Time{}, refused: map[int]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v23.0/{number}/messages", f.messages)
	srv := httptest.NewServer(mux)
	f.URL = srv.URL + "/v23.0"
	tb.Cleanup(srv.Close)
	return f
}

// Inbound notes that user (E.164) wrote to the business at at: its
// customer-service window opens for 24 h.
func (f *WhatsAppAPI) Inbound(user string, at time.Time) {
	f.mu.Lock()
	f.inbound[user] = at
	f.mu.Unlock()
}

// Refused counts the requests refused, by Meta's error code.
func (f *WhatsAppAPI) Refused() map[int]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int]int{}
	for k, v := range f.refused {
		out[k] = v
	}
	return out
}

// OverLimit counts the templates accepted past the messaging limit, which
// Meta does not deliver.
func (f *WhatsAppAPI) OverLimit() int { f.mu.Lock(); defer f.mu.Unlock(); return f.overLimit }

type waMessage struct {
	Product  string                 `json:"messaging_product"`
	To       string                 `json:"to"`
	Type     string                 `json:"type"`
	Opaque   string                 `json:"biz_opaque_callback_data"`
	Text     *struct{ Body string } `json:"text"`
	Template *struct {
		Name string `json:"name"`
	} `json:"template"`
}

func (f *WhatsAppAPI) messages(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.Token {
		waError(w, http.StatusUnauthorized, 190, "Invalid OAuth access token")
		return
	}
	var m waMessage
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil || m.Product != "whatsapp" || m.To == "" ||
		(m.Type == "text") == (m.Template != nil) || (m.Type == "text" && m.Text == nil) {
		waError(w, http.StatusBadRequest, 100, "Invalid parameter")
		return
	}
	number, user := r.PathValue("number"), "+"+strings.TrimPrefix(m.To, "+")
	body := m.Type
	if m.Template != nil {
		body = m.Template.Name
	} else {
		body = m.Text.Body
	}
	// A test's own answer first (SetReply: a Meta error code, e.g. 131026),
	// then Meta's limits.
	code, _ := f.decide(user, body)
	deliver := false
	if code == 0 {
		code, deliver = f.admit(number, user, m.Type == "template", time.Now())
	}
	if code != 0 {
		waError(w, http.StatusBadRequest, code, "refused by the fake Cloud API's limits")
		f.wake()
		return
	}
	id := newSID("wamid.")
	if deliver {
		f.record(Delivery{At: time.Now(), ID: m.Opaque, To: user, From: number, Body: body, SID: id})
	} else {
		f.wake()
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"messaging_product":"whatsapp","contacts":[{"input":%q,"wa_id":%q}],"messages":[{"id":%q}]}`, m.To, strings.TrimPrefix(user, "+"), id)
}

// admit applies Meta's limits to one message at now: a refusal's code, or
// 0 and whether it is delivered (a template past the messaging limit is not).
func (f *WhatsAppAPI) admit(number, user string, template bool, now time.Time) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.limits
	if l.Throughput > 0 && within(f.numbers[number], now, time.Second) >= l.Throughput {
		f.refused[WACodeThroughput]++
		return WACodeThroughput, false
	}
	pair := number + "|" + user
	if l.PairCount > 0 && within(f.pairs[pair], now, l.PairWindow) >= l.PairCount {
		f.refused[WACodePairRate]++
		return WACodePairRate, false
	}
	if !template {
		if at, ok := f.inbound[user]; !ok || now.Sub(at) >= 24*time.Hour {
			f.refused[WACodeReengagement]++
			return WACodeReengagement, false
		}
	}
	f.numbers[number] = append(f.numbers[number], now)
	f.pairs[pair] = append(f.pairs[pair], now)
	if !template {
		return 0, true
	}
	if l.Portfolio > 0 {
		counted := 0
		last, known := f.latest[user]
		for _, t := range f.latest {
			if now.Sub(t) <= l.Window {
				counted++
			}
		}
		if !(known && now.Sub(last) <= l.Window) && counted >= l.Portfolio {
			f.overLimit++
			return 0, false
		}
	}
	f.latest[user] = now
	return 0, true
}

// within counts the times in [now - d, now].
func within(ts []time.Time, now time.Time, d time.Duration) int {
	n := 0
	for _, t := range ts {
		if now.Sub(t) <= d {
			n++
		}
	}
	return n
}

func waError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"OAuthException","code":%d,"error_data":{"messaging_product":"whatsapp","details":%q},"fbtrace_id":"AbCdEf"}}`, msg, code, msg)
}
