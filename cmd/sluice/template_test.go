package main

import (
	"strings"
	"testing"
)

// sluice template set stores a tenant's digest template with a version, show
// and list print it, delete drops it; one that does not parse, or fails on a
// sample digest, is a usage error and stores nothing.
func TestTemplateCommands(t *testing.T) {
	env(t)
	for _, bad := range [][]string{
		{"template", "set", "acme", "email.comment", "--subject", "{{.Count"},                   // does not parse
		{"template", "set", "acme", "email.comment", "--text", "{{.Nope}}"},                     // no such field: fails on the sample
		{"template", "set", "acme", "email.comment", "--html", "{{range .Items}}{{.X}}{{end}}"}, // fails on the sample
		{"template", "set", "acme", "sms.alerts", "--subject", "x"},                             // an SMS has no subject
		{"template", "set", "acme", "fax.comment", "--text", "x"},                               // no such channel
		{"template", "set", "acme", "email.comment"},                                            // nothing to set
	} {
		if r := sluice(t, "", bad...); r.code != 2 {
			t.Errorf("%q: %+v, want a usage error", bad, r)
		}
	}
	if r := sluice(t, "", "template", "list"); r.code != 0 || r.stdout != "" {
		t.Fatalf("refused templates were stored: %+v", r)
	}
	if r := sluice(t, "{{.Count}} new: {{range .Items}}{{.Subject}}; {{end}}\n", "template", "set", "acme", "email.comment",
		"--subject", "{{.Count}} new comments", "--text-file", "-", "--by", "ops"); r.code != 0 || !strings.Contains(r.stdout, "version 1 set by ops") {
		t.Fatalf("set: %+v", r)
	}
	if r := sluice(t, "", "template", "set", "acme", "email.comment", "--subject", "{{.Count}} comments", "--by", "ops"); r.code != 0 || !strings.Contains(r.stdout, "version 2") {
		t.Fatalf("set again: %+v", r)
	}
	if r := sluice(t, "", "template", "show", "acme", "email.comment", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"subject":"{{.Count}} comments"`) || !strings.Contains(r.stdout, `"version":2`) {
		t.Fatalf("show: %+v", r)
	}
	if r := sluice(t, "", "template", "list"); r.code != 0 || !strings.Contains(r.stdout, "acme/email.comment\tversion 2\tops") {
		t.Fatalf("list: %+v", r)
	}
	if r := sluice(t, "", "template", "delete", "acme", "email.comment"); r.code != 0 {
		t.Fatalf("delete: %+v", r)
	}
	if r := sluice(t, "", "template", "show", "acme", "email.comment"); r.code != 1 || !strings.Contains(r.stderr, "built-in") {
		t.Fatalf("show after delete: %+v", r)
	}
}
