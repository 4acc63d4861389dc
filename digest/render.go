package digest

import (
	htmltemplate "html/template"
	"text/template"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/tasks"
)

// View is what a digest's templates are given.
type View struct {
	Count int        // items carried
	More  int        // items after the first
	First ItemView   // the first (the carrier's own)
	Items []ItemView // every item, in the order they came
}

// ItemView is one item in View.
type ItemView struct {
	ID         string
	Subject    string
	Body       string
	Metadata   map[string]string
	EnqueuedAt time.Time
}

// The built-in templates: the subject and text of an email, its HTML part
// (html/template: every item's text is escaped), and an SMS.
var (
	emailSubject = template.Must(template.New("subject").Parse(
		`{{.First.Subject}}{{if .More}} (+{{.More}} more){{end}}`))
	emailText = template.Must(template.New("text").Parse(
		`{{range $i, $it := .Items}}{{if $i}}

{{end}}{{if $it.Subject}}{{$it.Subject}}
{{end}}{{$it.Body}}{{end}}
`))
	emailHTML = htmltemplate.Must(htmltemplate.New("html").Parse(
		`<ul>{{range .Items}}<li>{{if .Subject}}<strong>{{.Subject}}</strong><br>{{end}}{{.Body}}</li>{{end}}</ul>`))
	smsText = template.Must(template.New("sms").Parse(
		`{{.Count}} updates: {{range $i, $it := .Items}}{{if $i}} | {{end}}{{$it.Body}}{{end}}`))
)

// NewView is the view of items, in order.
func NewView(items []tasks.Notification) View {
	v := View{Count: len(items), More: max(len(items)-1, 0)}
	for _, n := range items {
		v.Items = append(v.Items, ItemView{ID: n.ID, Subject: n.Subject, Body: n.Body, Metadata: n.Metadata, EnqueuedAt: n.EnqueuedAt})
	}
	if len(v.Items) > 0 {
		v.First = v.Items[0]
	}
	return v
}

// Render returns carrier as the message that carries items (carrier's
// own first), with the built-in templates: its subject and body, and for
// email its HTML part when the carrier had one, replaced by the digest's;
// everything else — recipient, sender, headers, List-Unsubscribe — is the
// carrier's. An SMS is cut to tasks.MaxSMSRunes. RenderWith takes a
// tenant's Template.
func Render(carrier tasks.Notification, items []tasks.Notification) (tasks.Notification, error) {
	return render(carrier, items, compiled{})
}

// cut shortens s to at most n runes, ending it with "…" when it cuts.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
