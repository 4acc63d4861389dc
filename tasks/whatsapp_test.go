package tasks_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/tasks"
)

func TestWhatsAppValidation(t *testing.T) {
	ok := []tasks.Notification{
		tasks.NewWhatsAppTemplate("acme", "+14155550100", "order_shipped", "en_US", "Ann", "42"),
		tasks.NewWhatsAppTemplate("acme", "+1 (415) 555-0100", "hello_world", ""),
		tasks.NewWhatsAppText("acme", "+14155550100", "Your order is on its way"),
	}
	for _, n := range ok {
		if err := n.Normalized().Validate(); err != nil {
			t.Errorf("%+v: %v", n, err)
		}
	}
	withTemplate := func(edit func(*tasks.Notification)) tasks.Notification {
		n := tasks.NewWhatsAppTemplate("acme", "+14155550100", "order_shipped", "en_US", "Ann")
		edit(&n)
		return n
	}
	for field, n := range map[string]tasks.Notification{
		"to":                withTemplate(func(n *tasks.Notification) { n.To = "ann@example.com" }),
		"from":              withTemplate(func(n *tasks.Notification) { n.From = "+15550006" }),
		"subject":           withTemplate(func(n *tasks.Notification) { n.Subject = "hi" }),
		"body":              withTemplate(func(n *tasks.Notification) { n.Body = "hi" }),
		"template.name":     withTemplate(func(n *tasks.Notification) { n.Template.Name = "Order-Shipped" }),
		"template.language": withTemplate(func(n *tasks.Notification) { n.Template.Language = "en-US!" }),
		"template.params":   withTemplate(func(n *tasks.Notification) { n.Template.Params = []string{""} }),
		"html":              withTemplate(func(n *tasks.Notification) { n.HTML = "<p>" }),
		"template":          {ID: "x", Tenant: "acme", Channel: tasks.SMS, To: "+14155550100", Body: "hi", Template: &tasks.Template{Name: "a"}},
	} {
		err := n.Normalized().Validate()
		var fe *tasks.FieldError
		if !errors.Is(err, tasks.ErrInvalid) || !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: got %v, want an invalid %s", field, err, field)
		}
	}
	long := tasks.NewWhatsAppText("acme", "+14155550100", strings.Repeat("x", tasks.MaxWhatsAppTextRunes+1))
	if err := long.Validate(); !errors.Is(err, tasks.ErrInvalid) {
		t.Errorf("a text over %d characters: %v", tasks.MaxWhatsAppTextRunes, err)
	}
	if err := (tasks.Notification{ID: "x", Tenant: "acme", Channel: tasks.WhatsApp, To: "+14155550100"}).Validate(); !errors.Is(err, tasks.ErrInvalid) {
		t.Errorf("neither a template nor a text: %v", err)
	}
}

// A WhatsApp recipient is an E.164 number, as an SMS's.
func TestCheckRecipientWhatsApp(t *testing.T) {
	if err := tasks.CheckRecipient(tasks.WhatsApp, "+1 (415) 555-0100"); err != nil {
		t.Errorf("a number: %v", err)
	}
	for _, bad := range []string{"ann@example.com", "14155550100", ""} {
		if err := tasks.CheckRecipient(tasks.WhatsApp, bad); !errors.Is(err, tasks.ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", bad, err)
		}
	}
}
