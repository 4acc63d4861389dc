package api_test

import (
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sluicehq/sluice/api"
)

// The server checks recipients and from with the patterns openapi.yaml
// states, letter for letter.
func TestPatternsAreTheDocuments(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	schemas := doc.Components.Schemas
	param := func(path, name string) string {
		for _, p := range doc.Paths.Find(path).Operations()["GET"].Parameters {
			if p.Value.Name == name {
				return p.Value.Schema.Value.Pattern
			}
		}
		t.Fatalf("%s has no parameter %s", path, name)
		return ""
	}
	for name, c := range map[string]struct{ got, want string }{
		"SMSEvent.recipient":   {schemas["SMSEvent"].Value.Properties["recipient"].Value.Pattern, api.E164Pattern},
		"EmailEvent.recipient": {schemas["EmailEvent"].Value.Properties["recipient"].Value.Pattern, api.EmailPattern},
		"EmailNotification.to": {schemas["EmailNotification"].Value.Properties["to"].Value.Pattern, api.EmailPattern},
		"SMSNotification.to":   {schemas["SMSNotification"].Value.Properties["to"].Value.Pattern, api.E164Pattern},
		"quotas from":          {param("/v1/quotas", "from"), api.FromPattern},
		"suppressions sms":     {doc.Paths.Find("/v1/suppressions/sms/{recipient}").Parameters[0].Value.Schema.Value.Pattern, `^(\+[1-9][0-9]{6,14}|~[A-Za-z0-9_-]{22})$`},
		"suppressions email":   {doc.Paths.Find("/v1/suppressions/email/{recipient}").Parameters[0].Value.Schema.Value.Pattern, "^(" + api.EmailPattern[1:len(api.EmailPattern)-1] + "|~[A-Za-z0-9_-]{22})$"},
		"quotas recipient":     {param("/v1/quotas", "recipient"), "^(" + api.E164Pattern[1:len(api.E164Pattern)-1] + "|" + api.EmailPattern[1:len(api.EmailPattern)-1] + ")$"},
	} {
		if c.got != c.want {
			t.Errorf("%s: the document's pattern\n  %s\nthe server's\n  %s", name, c.got, c.want)
		}
	}
}
