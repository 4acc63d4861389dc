// Package providers lists every sender provider the binary can use. A new
// provider is a new package under sender/ and one line here.
package providers

import (
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/logsender"
	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/sender/telnyx"
	"github.com/sluicehq/sluice/sender/twilio"
	"github.com/sluicehq/sluice/sender/whatsapp"
)

// All are the providers, by channel and name (SLUICE_EMAIL_SENDER, SLUICE_SMS_SENDER, SLUICE_WHATSAPP_SENDER).
var All = []sender.Provider{
	logsender.Email,
	smtp.Provider,
	logsender.SMS,
	twilio.Provider,
	telnyx.Provider,
	logsender.WhatsApp,
	whatsapp.Provider,
}
