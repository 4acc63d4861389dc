package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"strings"
	"testing"
)

// sluice webhook set stores a tenant's credentials sealed (no secret in
// Redis in clear), show lists them without secrets, remove drops them; a
// bad provider or key is a usage error and stores nothing.
func TestWebhookCommands(t *testing.T) {
	srv := env(t)
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	key := base64.StdEncoding.EncodeToString(der)
	if r := sluice(t, "", "webhook", "set", "acme", "sparkpost", "--key", key); r.code != 2 {
		t.Fatalf("an unknown provider: %+v", r)
	}
	if r := sluice(t, "", "webhook", "set", "acme", "sendgrid", "--key", "not-a-key"); r.code != 2 {
		t.Fatalf("a bad key: %+v", r)
	}
	if r := sluice(t, key+"\n", "webhook", "set", "acme", "sendgrid", "--key-file", "-"); r.code != 0 || !strings.Contains(r.stdout, "/v1/webhooks/sendgrid/acme") {
		t.Fatalf("set: %+v", r)
	}
	const pass = "pm-password-0123456789"
	if r := sluice(t, "", "webhook", "set", "acme", "postmark", "--user", "sluice", "--password", pass, "--allow-ip", "3.134.147.250"); r.code != 0 {
		t.Fatalf("set postmark: %+v", r)
	}
	if r := sluice(t, "", "webhook", "set", "acme", "ses", "--topic", "arn:aws:sns:us-east-1:123456789012:ses-acme"); r.code != 0 {
		t.Fatalf("set ses: %+v", r)
	}
	rdb := srv.Client(t)
	for field, v := range rdb.HGetAll(t.Context(), "sluice:{acme}:webhooks").Val() {
		if strings.Contains(v, pass) || strings.Contains(v, key[30:60]) || strings.Contains(v, "sluice") {
			t.Errorf("%s is stored in clear: %q", field, v)
		}
	}
	r := sluice(t, "", "webhook", "show", "acme")
	if r.code != 0 || !strings.Contains(r.stdout, "postmark\t/v1/webhooks/postmark/acme\tuser sluice\tallow 3.134.147.250") ||
		!strings.Contains(r.stdout, "ses\t/v1/webhooks/ses/acme\ttopics arn:aws:sns:us-east-1:123456789012:ses-acme") || strings.Contains(r.stdout, pass) || strings.Contains(r.stdout, key) {
		t.Fatalf("show: %+v", r)
	}
	if r := sluice(t, "", "webhook", "remove", "acme", "sendgrid"); r.code != 0 {
		t.Fatalf("remove: %+v", r)
	}
	if r := sluice(t, "", "webhook", "remove", "acme", "sendgrid"); r.code != 1 {
		t.Fatalf("remove again: %+v", r)
	}
	if r := sluice(t, "", "webhook", "show", "acme", "--json"); r.code != 0 || strings.Contains(r.stdout, "sendgrid") || !strings.Contains(r.stdout, `"provider":"ses"`) {
		t.Fatalf("show after remove: %+v", r)
	}
}
