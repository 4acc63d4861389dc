package ses

import (
	"encoding/json"
	"fmt"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/webhook"
)

// notification is what Sluice reads of an SES notification.
type notification struct {
	NotificationType string `json:"notificationType"`
	EventType        string `json:"eventType"` // event publishing (configuration sets)
	Bounce           *struct {
		BounceType        string `json:"bounceType"`
		FeedbackID        string `json:"feedbackId"`
		BouncedRecipients []struct {
			EmailAddress   string `json:"emailAddress"`
			DiagnosticCode string `json:"diagnosticCode"`
		} `json:"bouncedRecipients"`
	} `json:"bounce"`
	Complaint *struct {
		FeedbackID            string `json:"feedbackId"`
		ComplaintFeedbackType string `json:"complaintFeedbackType"`
		ComplaintSubType      string `json:"complaintSubType"`
		ComplainedRecipients  []struct {
			EmailAddress string `json:"emailAddress"`
		} `json:"complainedRecipients"`
	} `json:"complaint"`
	Mail struct {
		MessageID string `json:"messageId"`
	} `json:"mail"`
}

// MaxRecipients bounds the recipients of one notification (SES sends to at
// most 50 per message).
const MaxRecipients = 1000

// Notification reads an SES notification (an SNS message's Message).
func Notification(msg []byte) (webhook.Batch, error) {
	var n notification
	if err := json.Unmarshal(msg, &n); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: Message is not an SES notification (JSON)", webhook.ErrMalformed)
	}
	kind := n.NotificationType
	if kind == "" {
		kind = n.EventType
	}
	var b webhook.Batch
	switch {
	case kind == "Bounce" && n.Bounce != nil:
		if len(n.Bounce.BouncedRecipients) > MaxRecipients {
			return webhook.Batch{}, fmt.Errorf("%w: over %d bounced recipients", webhook.ErrMalformed, MaxRecipients)
		}
		ref := webhook.Ref(Name, first(n.Mail.MessageID, n.Bounce.FeedbackID))
		for _, r := range n.Bounce.BouncedRecipients {
			if n.Bounce.BounceType != "Permanent" {
				b.Ignored++
				continue
			}
			b.Items = append(b.Items, webhook.Item{Recipient: r.EmailAddress,
				Report: consent.Report{Type: consent.TypeBounce, Code: webhook.SMTPCode(r.DiagnosticCode), Ref: ref}})
		}
	case kind == "Complaint" && n.Complaint != nil:
		c := n.Complaint
		if len(c.ComplainedRecipients) > MaxRecipients {
			return webhook.Batch{}, fmt.Errorf("%w: over %d complained recipients", webhook.ErrMalformed, MaxRecipients)
		}
		ref := webhook.Ref(Name, first(n.Mail.MessageID, c.FeedbackID))
		for _, r := range c.ComplainedRecipients {
			if c.ComplaintFeedbackType == "not-spam" || c.ComplaintSubType == "OnAccountSuppressionList" {
				b.Ignored++
				continue
			}
			b.Items = append(b.Items, webhook.Item{Recipient: r.EmailAddress, Report: consent.Report{Type: consent.TypeComplaint, Ref: ref}})
		}
	default:
		b.Ignored = 1
	}
	return b, nil
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
