package twilio

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/sluicehq/sluice/internal/problem"
)

// readSignedForm reads the form of a provider's webhook (a status callback,
// an incoming message) at baseURL + the request's path, and checks its
// X-Twilio-Signature under authToken before anything is taken from it.
// what names the webhook in answers ("a status callback"). A missing or
// wrong signature is refused with 403 (and badSignature called for a wrong
// one), anything else unreadable with 4xx; ok is false when an answer was
// written.
func readSignedForm(w http.ResponseWriter, r *http.Request, authToken, baseURL, what string, badSignature func()) (url.Values, bool) {
	sig := r.Header.Get("X-Twilio-Signature")
	if sig == "" {
		problem.Write(w, http.StatusForbidden, "bad-signature", "no X-Twilio-Signature header: "+what+" must be signed with the SMS auth token")
		return nil, false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		problem.Write(w, http.StatusUnsupportedMediaType, "unsupported-media", what+" is a form: Content-Type: application/x-www-form-urlencoded")
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCallbackBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem.Write(w, http.StatusRequestEntityTooLarge, "too-large", what+" is at most 64 KiB")
			return nil, false
		}
		problem.Write(w, http.StatusBadRequest, "invalid-request", "the body could not be read")
		return nil, false
	}
	params, err := url.ParseQuery(string(body))
	if err != nil {
		problem.Write(w, http.StatusBadRequest, "invalid-request", "the body is not a URL-encoded form")
		return nil, false
	}
	if !validSignature(authToken, strings.TrimRight(baseURL, "/")+r.URL.RequestURI(), params, sig) {
		badSignature()
		problem.Write(w, http.StatusForbidden, "bad-signature",
			"the X-Twilio-Signature does not match: the provider must sign with SLUICE_SMS_AUTH_TOKEN, and SLUICE_SMS_STATUS_CALLBACK_URL must be the base URL the provider calls")
		return nil, false
	}
	return params, true
}
