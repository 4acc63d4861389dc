package config_test

import (
	"testing"

	"github.com/sluicehq/sluice/config"
)

// Each tenant may send from its own domains; * covers the tenants not
// named; with neither, only SMTP_FROM's domain; empty allows any.
func TestFromDomains(t *testing.T) {
	f, err := config.ParseFromDomains("acme=acme.com|mail.acme.io, *=shared.example")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant, from string
		ok           bool
	}{
		{"acme", "news@acme.com", true},
		{"acme", "news@MAIL.acme.io", true},
		{"acme", "news@globex.com", false},
		{"acme", "news@shared.example", false},
		{"globex", "news@shared.example", true},
		{"globex", "news@acme.com", false},
	} {
		if got := f.Allows(c.tenant, c.from, "sluice@localhost"); got != c.ok {
			t.Errorf("%s from %s: %v, want %v", c.tenant, c.from, got, c.ok)
		}
	}
	only, _ := config.ParseFromDomains("acme=acme.com")
	if only.Allows("globex", "x@acme.com", "sluice@sender.example") || !only.Allows("globex", "x@sender.example", "sluice@sender.example") {
		t.Error("a tenant not named may use SMTP_FROM's domain only")
	}
	if any, _ := config.ParseFromDomains(""); !any.Allows("acme", "x@anything.example", "") {
		t.Error("empty allows any domain")
	}
	for _, bad := range []string{"acme", "acme=", "acme=a@b.com", "acme=nodot", "a cme=acme.com", "acme=acme.com,acme=acme.io"} {
		if _, err := config.ParseFromDomains(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseFromDomains(f *testing.F) {
	for _, s := range []string{"acme=acme.com|mail.acme.io,*=shared.example", "", "=", "a=b.c|", "*=x.y,*=z.w"} {
		f.Add(s, "acme", "n@acme.com")
	}
	f.Fuzz(func(t *testing.T, s, tenant, from string) {
		fd, err := config.ParseFromDomains(s)
		if err != nil {
			return
		}
		_ = fd.Allows(tenant, from, "sluice@localhost")
	})
}
