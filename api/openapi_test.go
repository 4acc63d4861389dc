package api_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/unsubscribe"
)

// The unsubscribe pages and the inbound webhook's TwiML are checked as
// text (registered once, before the parallel tests read the decoders).
func init() {
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/xml", openapi3filter.PlainBodyDecoder)
}

// The OpenAPI document is valid OpenAPI 3.1, and the handlers do what it
// says: real requests (the valid ones pass its request validation, the
// invalid ones fail it) and every real response, status and headers
// included, checked with openapi3filter. Every documented operation is
// exercised.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	t.Parallel()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() || doc.IsOpenAPI32OrLater() {
		t.Fatalf("openapi %q, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.yaml is not valid: %v", err)
	}
	doc.Servers = nil // match the test server's address
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, "sms:recipient=1/1m,sms:tenant=1000/1h,email:recipient=10/1m,acme/sms:inbound=+15005550006", nil)
	acme, globex := b.Tokens["acme"], b.Tokens["globex"]
	var queuedID string
	signer, err := unsubscribe.NewSigner("test-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	subject, err := b.API.Services().Consent.Subject("acme", tasks.Email, "eve@example.com")
	if err != nil {
		t.Fatal(err)
	}
	unsub, err := signer.Token(unsubscribe.Link{Tenant: "acme", Category: "newsletter", Subject: subject})
	if err != nil {
		t.Fatal(err)
	}
	markSent(t, b, "acme", "sent-1") // as a worker records a send
	const form = "MessageSid=SM0123&MessageStatus=delivered&To=%2B14155550100&AccountSid=AC0123"
	formType := "application/x-www-form-urlencoded"
	type step struct {
		name         string
		method, path string
		token        string
		body         string
		headers      []string
		status       int
		validRequest bool
	}
	steps := []step{
		{"EnqueueOne", "POST", "/v1/notifications", acme, `{"channel":"sms","to":"+14155550100","body":"hi","category":"otp","ttl":"10m"}`, nil, 202, true},
		{"EnqueueBatch", "POST", "/v1/notifications", acme, `{"notifications":[{"channel":"sms","to":"+14155550101","body":"a"},{"channel":"email","to":"ann@example.com","subject":"s","body":"b","metadata":{"k":"v"},"expires_at":"2099-01-01T00:00:00Z"}]}`, nil, 202, true},
		{"EnqueueWithKey", "POST", "/v1/notifications", acme, `{"channel":"sms","to":"+14155550102","body":"k"}`, []string{"Idempotency-Key", `"k-1"`}, 202, true},
		{"Replay", "POST", "/v1/notifications", acme, `{"channel":"sms","to":"+14155550102","body":"k"}`, []string{"Idempotency-Key", `"k-1"`}, 202, true},
		{"KeyMismatch", "POST", "/v1/notifications", acme, `{"channel":"sms","to":"+14155550102","body":"other"}`, []string{"Idempotency-Key", `"k-1"`}, 422, true},
		{"InvalidFields", "POST", "/v1/notifications", acme, `{"channel":"sms","to":"nope","body":"","colour":"red"}`, nil, 422, false},
		{"InvalidBatch", "POST", "/v1/notifications", acme, `{"notifications":[{"channel":"sms","to":"+14155550100","body":"ok"},{"channel":"fax","to":"x","body":"y"}]}`, nil, 422, false},
		{"Malformed", "POST", "/v1/notifications", acme, `{"notifications":`, nil, 400, false},
		{"WrongMediaType", "POST", "/v1/notifications", acme, `hi`, []string{"Content-Type", "text/plain"}, 415, false},
		{"NoToken", "POST", "/v1/notifications", "", `{"channel":"sms","to":"+14155550100","body":"hi"}`, nil, 401, false},
		{"OtherTenant", "POST", "/v1/notifications", globex, `{"tenant":"acme","channel":"sms","to":"+14155550100","body":"hi"}`, nil, 403, true},
		{"Status", "GET", "/v1/notifications/{queued}", acme, "", nil, 200, true},
		{"StatusOtherTenant", "GET", "/v1/notifications/{queued}", globex, "", nil, 404, true},
		{"StatusMissing", "GET", "/v1/notifications/nope", acme, "", nil, 404, true},
		{"Quotas", "GET", "/v1/quotas?channel=sms&recipient=%2B14155550100", acme, "", nil, 200, true},
		{"QuotasAdmin", "GET", "/v1/quotas?tenant=acme", adminToken, "", nil, 200, true},
		{"QuotasOtherTenant", "GET", "/v1/quotas?tenant=acme", globex, "", nil, 403, true},
		{"QuotasNoRules", "GET", "/v1/quotas?channel=email", acme, "", nil, 422, true},
		{"QuotasBadChannel", "GET", "/v1/quotas?channel=fax", acme, "", nil, 400, false},
		{"QuotasFrom", "GET", "/v1/quotas?channel=sms&from=%2B15005550006", acme, "", nil, 200, true},
		{"QuotasBadFrom", "GET", "/v1/quotas?from=caf%C3%A9", acme, "", nil, 400, false},
		{"QuotasEmptyFrom", "GET", "/v1/quotas?from=", acme, "", nil, 400, false},
		{"Callback", "POST", "/v1/callbacks/sms/acme/sent-1", "", form, []string{"Content-Type", formType, "X-Twilio-Signature", "{sign}"}, 204, true},
		{"StatusDelivered", "GET", "/v1/notifications/sent-1", acme, "", nil, 200, true},
		{"CallbackUnsigned", "POST", "/v1/callbacks/sms/acme/sent-1", "", form, []string{"Content-Type", formType}, 403, false},
		{"CallbackMissigned", "POST", "/v1/callbacks/sms/acme/sent-1", "", form, []string{"Content-Type", formType, "X-Twilio-Signature", "bm9wZQ=="}, 403, true},
		{"CallbackUnknown", "POST", "/v1/callbacks/sms/acme/{queued}", "", form, []string{"Content-Type", formType, "X-Twilio-Signature", "{sign}"}, 404, true},
		{"CallbackNoStatus", "POST", "/v1/callbacks/sms/acme/sent-1", "", "MessageSid=SM1", []string{"Content-Type", formType, "X-Twilio-Signature", "{sign}"}, 400, false},
		{"SuppressionNone", "GET", "/v1/suppressions/sms/+14155550170", acme, "", nil, 200, true},
		{"SuppressionOptOut", "POST", "/v1/suppressions/sms/%2B14155550170", acme, `{"type":"out","scope":"marketing"}`, nil, 200, true},
		{"SuppressionUndeliverable", "POST", "/v1/suppressions/email/ann@example.com", acme, `{"type":"undeliverable","until":"2099-01-01T00:00:00Z","code":550}`, nil, 200, true},
		{"SuppressionBadType", "POST", "/v1/suppressions/sms/+14155550170", acme, `{"type":"maybe"}`, nil, 422, false},
		{"SuppressionLedger", "GET", "/v1/suppressions/sms/+14155550170?tenant=acme", adminToken, "", nil, 200, true},
		{"SuppressionOtherTenant", "GET", "/v1/suppressions/sms/+14155550170?tenant=acme", globex, "", nil, 403, true},
		{"SuppressionBadRecipient", "GET", "/v1/suppressions/sms/not-a-number", acme, "", nil, 400, false},
		{"SuppressionSpacedNumber", "GET", "/v1/suppressions/sms/+1%20415%20555%200170", acme, "", nil, 400, false},
		{"SuppressionNumberAsEmail", "GET", "/v1/suppressions/email/+14155550170", acme, "", nil, 400, false},
		{"SuppressionPut", "PUT", "/v1/suppressions/sms/+14155550170", acme, `{"type":"out"}`, nil, 200, true},
		{"SuppressionBySubject", "GET", "/v1/suppressions/email/~{subject}", acme, "", nil, 200, true},
		{"SuppressionBadSubject", "GET", "/v1/suppressions/email/~short", acme, "", nil, 400, false},
		{"SuppressionPutEmail", "PUT", "/v1/suppressions/email/ann@example.com", acme, `{"type":"out","category":"news"}`, nil, 200, true},
		{"SuppressionUntilPast", "POST", "/v1/suppressions/email/ann@example.com", acme, `{"type":"out","until":"2020-01-01T00:00:00Z"}`, nil, 422, true},
		{"SuppressionLiftEmail", "DELETE", "/v1/suppressions/email/ann@example.com", acme, "", nil, 200, true},
		{"SuppressionLift", "DELETE", "/v1/suppressions/sms/+14155550170", acme, "", nil, 200, true},
		{"Events", "POST", "/v1/events/email", acme, `{"events":[{"recipient":"bob@example.com","type":"bounce","code":550,"ref":"mx-1"},{"recipient":"cy@example.com","type":"complaint"},{"recipient":"di@example.com","type":"unsubscribe","category":"marketing"}]}`, nil, 200, true},
		{"EventsOneBad", "POST", "/v1/events/email", acme, `{"events":[{"recipient":"bob@example.com","type":"bounce"},{"recipient":"nope","type":"complaint"}]}`, nil, 422, false},
		{"EventsSMS", "POST", "/v1/events/sms", acme, `{"events":[{"recipient":"+14155550172","type":"unsubscribe","ref":"SM1"}]}`, nil, 200, true},
		{"EventsSMSAsEmail", "POST", "/v1/events/sms", acme, `{"events":[{"recipient":"bob@example.com","type":"bounce"}]}`, nil, 422, false},
		{"EventsEmpty", "POST", "/v1/events/email", acme, `{"events":[]}`, nil, 422, false},
		{"Inbound", "POST", "/v1/inbound/sms/acme", "", "From=%2B14155550171&To=%2B15005550006&Body=STOP&MessageSid=SM9", []string{"Content-Type", formType, "X-Twilio-Signature", "{sign}"}, 200, true},
		{"InboundUnsigned", "POST", "/v1/inbound/sms/acme", "", "From=%2B14155550171&Body=STOP", []string{"Content-Type", formType}, 403, false},
		{"InboundNoFrom", "POST", "/v1/inbound/sms/acme", "", "Body=STOP", []string{"Content-Type", formType, "X-Twilio-Signature", "{sign}"}, 400, false},
		{"WebhookSESNotConfigured", "POST", "/v1/webhooks/ses/acme", "", `{"Type":"Notification"}`, nil, 404, true},
		{"WebhookSendGridNotConfigured", "POST", "/v1/webhooks/sendgrid/acme", "", `[]`, []string{"X-Twilio-Email-Event-Webhook-Signature", "c2ln", "X-Twilio-Email-Event-Webhook-Timestamp", "1"}, 404, true},
		{"WebhookPostmarkNotConfigured", "POST", "/v1/webhooks/postmark/acme", "", `{"RecordType":"Bounce"}`, nil, 404, true},
		{"WebhookMailgunNotConfigured", "POST", "/v1/webhooks/mailgun/acme", "", `{"signature":{"timestamp":"1","token":"t","signature":"s"},"event-data":{}}`, nil, 404, true},
		{"TelnyxReportOff", "POST", "/v1/callbacks/telnyx/acme/sent-1", "", `{"data":{"event_type":"message.finalized","id":"e1"}}`, []string{"telnyx-signature-ed25519", "c2ln", "telnyx-timestamp", "1"}, 404, true},
		{"TelnyxInboundOff", "POST", "/v1/inbound/telnyx/acme", "", `{"data":{"event_type":"message.received","id":"e2"}}`, []string{"telnyx-signature-ed25519", "c2ln", "telnyx-timestamp", "1"}, 404, true},
		{"UnsubscribePage", "GET", "/u/{unsub}", "", "", nil, 200, true},
		{"UnsubscribeOneClick", "POST", "/u/{unsub}", "", "List-Unsubscribe=One-Click", []string{"Content-Type", formType}, 200, true},
		{"UnsubscribeForged", "POST", "/u/{unsub}x", "", "List-Unsubscribe=One-Click", []string{"Content-Type", formType}, 404, true},
		{"UnsubscribeNotOneClick", "POST", "/u/{unsub}", "", "List-Unsubscribe=Maybe", []string{"Content-Type", formType}, 400, false},
		{"OpenAPI", "GET", "/openapi.yaml", "", "", nil, 200, true},
		{"Healthz", "GET", "/healthz", "", "", nil, 200, true},
		{"Readyz", "GET", "/readyz", "", "", nil, 200, true},
		{"Metrics", "GET", "/metrics", "", "", nil, 200, true},
	}
	seen := map[string]bool{}
	ctx := context.Background()
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true,
		AuthenticationFunc: func(_ context.Context, in *openapi3filter.AuthenticationInput) error {
			if !strings.HasPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ") {
				return in.NewError(nil)
			}
			return nil
		}}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			path := strings.NewReplacer("{queued}", queuedID, "{unsub}", unsub, "{subject}", subject).Replace(s.path)
			newReq := func(base string) *http.Request {
				var body io.Reader
				if s.body != "" {
					body = strings.NewReader(s.body)
				}
				req, err := http.NewRequest(s.method, base+path, body)
				if err != nil {
					t.Fatal(err)
				}
				if s.body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				if s.token != "" {
					req.Header.Set("Authorization", "Bearer "+s.token)
				}
				for i := 0; i+1 < len(s.headers); i += 2 {
					v := s.headers[i+1]
					if v == "{sign}" { // signed as the provider would for this path
						params, _ := url.ParseQuery(s.body)
						v = fakes.Sign(b.SMS.AuthToken, b.CallbackURL+path, params)
					}
					req.Header.Set(s.headers[i], v)
				}
				return req
			}
			vreq := newReq("http://sluice.test")
			route, params, err := router.FindRoute(vreq)
			if err != nil {
				t.Fatalf("%s %s is not in openapi.yaml: %v", s.method, path, err)
			}
			seen[route.Method+" "+route.Path] = true
			in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts}
			reqErr := openapi3filter.ValidateRequest(ctx, in)
			if s.validRequest && reqErr != nil {
				t.Fatalf("a request the API takes fails openapi.yaml: %v", reqErr)
			}
			if !s.validRequest && reqErr == nil {
				t.Fatalf("a request the API refuses passes openapi.yaml")
			}
			resp, err := sluicetest.Client(t).Do(newReq(b.HTTP.URL))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != s.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, s.status, raw)
			}
			if s.name == "EnqueueOne" {
				queuedID = strings.TrimPrefix(resp.Header.Get("Location"), "/v1/notifications/")
			}
			out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: opts}
			out.SetBodyBytes(raw)
			if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
				t.Fatalf("the answer does not match openapi.yaml: %v\n%s", err, raw)
			}
		})
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !seen[method+" "+path] {
				t.Errorf("%s %s is documented but not exercised", method, path)
			}
		}
	}
}

// The document's NotificationInput (its email and SMS branches together)
// lists exactly the payload's fields (tasks.Notification's JSON names) less
// id and enqueued_at, plus ttl: a field added to the payload must be
// documented, and is then accepted. Its pattern of reserved header names
// is tasks.ReservedHeader's list.
func TestOpenAPINotificationFields(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, branch := range doc.Components.Schemas["NotificationInput"].Value.OneOf {
		for name := range branch.Value.Properties {
			documented[name] = true
		}
	}
	want := map[string]bool{"ttl": true}
	ty := reflect.TypeFor[tasks.Notification]()
	for i := 0; i < ty.NumField(); i++ {
		name, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		// Set by Sluice: the enqueue time, and on the fallbacks it sends.
		if name != "id" && name != "enqueued_at" && name != "fallback_for" && name != "fallback_on_timeout" && name != "" && name != "-" {
			want[name] = true
		}
	}
	for name := range want {
		if !documented[name] {
			t.Errorf("tasks.Notification field %q is not in openapi.yaml's NotificationInput", name)
		}
	}
	for name := range documented {
		if !want[name] {
			t.Errorf("openapi.yaml's NotificationInput documents %q, which is no field of tasks.Notification", name)
		}
	}
}

func TestOpenAPIReservedHeaders(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	names := doc.Components.Schemas["EmailNotification"].Value.Properties["headers"].Value.PropertyNames.Value
	reserved := regexp.MustCompile(names.Not.Value.Pattern)
	for _, h := range []string{"From", "to", "CC", "Bcc", "Subject", "Message-ID", "Date", "Reply-To", "Sender", "MIME-Version",
		"Content-Type", "content-disposition", "Content-ID", "Content-Transfer-Encoding", "List-Unsubscribe", "List-Unsubscribe-Post",
		"DKIM-Signature", "DomainKey-Signature", "ARC-Seal", "ARC-Message-Signature", "ARC-Authentication-Results",
		"Authentication-Results", "Received", "Received-SPF", "Return-Path", "Delivered-To", "Resent-From", "X-Sluice-Tenant",
		"X-Campaign", "Fromage", "X-From", "Tos", "Datex", "List-Unsubscribe-Posts", "Contents", "X-Sluice", "User-Agent", "X-Mailer"} {
		if got, want := reserved.MatchString(h), tasks.ReservedHeader(h); got != want {
			t.Errorf("%s: openapi.yaml says reserved=%v, tasks.ReservedHeader %v", h, got, want)
		}
	}
}
