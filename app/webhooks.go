package app

import (
	"github.com/sluicehq/sluice/sender/whatsapp"
	"github.com/sluicehq/sluice/webhook"
	webhooks "github.com/sluicehq/sluice/webhook/providers"
)

// Webhooks are the providers whose credentials `sluice webhook set` takes:
// the email providers' (webhook/providers), and WhatsApp, whose deliveries
// sender/whatsapp serves itself (its routes carry messages and statuses,
// not only consent events).
func Webhooks() []webhook.Provider { return append(webhooks.All(), whatsapp.CredentialsChecker{}) }

// LookupWebhook finds the provider named name among Webhooks.
func LookupWebhook(name string) (webhook.Provider, bool) {
	for _, p := range Webhooks() {
		if p.Name() == name {
			return p, true
		}
	}
	return nil, false
}

// WebhookNames lists the names of Webhooks.
func WebhookNames() []string {
	var out []string
	for _, p := range Webhooks() {
		out = append(out, p.Name())
	}
	return out
}
