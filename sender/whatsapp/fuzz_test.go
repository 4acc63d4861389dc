package whatsapp_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/sender/whatsapp"
	"github.com/sluicehq/sluice/webhook"
)

// A webhook delivery that parses is a WhatsApp one; one that does not is
// ErrMalformed, never a panic; and its signature checks only under the
// secret it was signed with.
func FuzzParsePayload(f *testing.F) {
	f.Add([]byte(sample(metaTextSample, "Does it come in another color?", fixedTime)))
	f.Add([]byte(sample(metaButtonSample, "", fixedTime)))
	f.Add([]byte(sample(metaStatusSample, "", fixedTime)))
	f.Add([]byte(`{"object":"page","entry":[]}`))
	f.Add([]byte(`{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages","value":{"messages":[{"timestamp":"-1"}]}}]}]}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := whatsapp.ParsePayload(body)
		if err != nil {
			if !errors.Is(err, webhook.ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if p.Object != "whatsapp_business_account" {
			t.Fatalf("parsed a delivery of %q", p.Object)
		}
		sig := whatsapp.Sign(acmeSecret, body)
		if whatsapp.VerifySignature(acmeSecret, sig, body) != nil || whatsapp.VerifySignature(zetaSecret, sig, body) == nil {
			t.Fatal("a signature checked under the wrong secret, or not under its own")
		}
	})
}
