package digest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/tasks"
)

// View is what a digest's templates are given.
type View struct {
	Count int      // items carried
	More  int      // items after the first
	First ItemView // the first (the carrier's own)
	Items Items    // every item, in the order they came
}

// Format prints a View as its count: a template's {{.}} never formats
// every item (the box, box.go).
func (v View) Format(f fmt.State, _ rune) { fmt.Fprintf(f, "%d items", v.Count) }

// Items are a digest's items.
type Items []ItemView

// Format prints Items as their count (bounded, as View).
func (it Items) Format(f fmt.State, _ rune) { fmt.Fprintf(f, "%d items", len(it)) }

// ItemView is one item in View.
type ItemView struct {
	ID         string
	Subject    string
	Body       string
	Metadata   Metadata
	EnqueuedAt time.Time
}

// Format prints an item as its id (bounded, as View).
func (it ItemView) Format(f fmt.State, _ rune) { fmt.Fprint(f, it.ID) }

// Metadata is an item's metadata.
type Metadata map[string]string

// Format prints metadata as key=value pairs in key order (a notification
// has at most tasks.MaxMetadata, each bounded).
func (m Metadata) Format(f fmt.State, _ rune) {
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			fmt.Fprint(f, " ")
		}
		fmt.Fprint(f, k+"="+m[k])
	}
}

// The built-in templates: the subject and text of an email, its HTML part
// (html/template: every item's text is escaped), and an SMS. They run in
// the box like a tenant's, but cut where a part is full instead of failing.
const (
	builtinSubject = `{{.First.Subject}}{{if .More}} (+{{.More}} more){{end}}`
	builtinText    = `{{range $i, $it := .Items}}{{if $i}}

{{end}}{{if $it.Subject}}{{$it.Subject}}
{{end}}{{$it.Body}}{{end}}
`
	builtinHTML = `<ul>{{range .Items}}<li>{{if .Subject}}<strong>{{.Subject}}</strong><br>{{end}}{{.Body}}</li>{{end}}</ul>`
	builtinSMS  = `{{.Count}} updates: {{range $i, $it := .Items}}{{if $i}} | {{end}}{{$it.Body}}{{end}}`
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
// carrier's. An SMS is cut to tasks.MaxSMSRunes, an email's part to
// Limits.Bytes. RenderWith takes a tenant's Template.
func Render(carrier tasks.Notification, items []tasks.Notification) (tasks.Notification, error) {
	return render(carrier, items, nil, DefaultLimits)
}

// cut shortens s to at most n runes, ending it with "…" when it cuts.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// cutBytes shortens s to at most n bytes on a character boundary, ending
// it with "…" when it cuts.
func cutBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-len("…")]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// render is the digest message of items under t (nil: the built-in
// templates), in a box of lim.
func render(carrier tasks.Notification, items []tasks.Notification, t *Template, lim Limits) (tasks.Notification, error) {
	v := NewView(items)
	b := newBox(lim)
	out := carrier
	out.TemplateID = ""
	own := func(src string) bool { return t != nil && src != "" }
	pick := func(src, builtin string) string {
		if own(src) {
			return src
		}
		return builtin
	}
	var tmpl Template
	if t != nil {
		tmpl = *t
	}
	if carrier.Channel == tasks.SMS {
		s, err := b.text("text", pick(tmpl.Text, builtinSMS), v, &partWriter{max: lim.Bytes, keepRunes: tasks.MaxSMSRunes, cut: !own(tmpl.Text), what: "SMS"})
		if err != nil {
			return carrier, err
		}
		out.Body = cut(s, tasks.MaxSMSRunes)
		return out, nil
	}
	s, err := b.text("subject", pick(tmpl.Subject, builtinSubject), v, &partWriter{max: lim.Bytes, cut: !own(tmpl.Subject), what: "subject"})
	if err != nil {
		return carrier, err
	}
	if out.Subject, err = subjectOf(s, own(tmpl.Subject)); err != nil {
		return carrier, err
	}
	if out.Body, err = b.text("text", pick(tmpl.Text, builtinText), v, &partWriter{max: lim.Bytes, cut: !own(tmpl.Text), what: "text"}); err != nil {
		return carrier, err
	}
	if carrier.HTML != "" {
		src := pick(tmpl.HTML, builtinHTML)
		h, err := parseHTML("html", src, b)
		if err != nil {
			return carrier, err
		}
		if out.HTML, err = run(htmlExec{h}, v, &partWriter{max: lim.Bytes, cut: !own(tmpl.HTML), what: "HTML part"}); err != nil {
			return carrier, err
		}
	}
	return out, nil
}

// text renders one text/template part in b.
func (b *box) text(name, src string, v View, p *partWriter) (string, error) {
	t, err := parseText(name, src, b)
	if err != nil {
		return "", err
	}
	return run(textExec{t}, v, p)
}

// subjectOf is a rendered subject as a header field: on one line, at most
// tasks.MaxSubjectLen bytes, with no control character. A tenant's
// template past either fails (ErrLimit); the built-in one is cut.
func subjectOf(s string, own bool) (string, error) {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
	if err := headerSafe(s); err != nil {
		if own {
			return "", overLimit("the subject %v", err)
		}
		s = strings.Map(func(r rune) rune {
			if headerSafe(string(r)) != nil {
				return ' '
			}
			return r
		}, s)
	}
	if own && strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("%w: the subject is empty", ErrBadTemplate)
	}
	if len(s) > tasks.MaxSubjectLen {
		if own {
			return "", overLimit("the subject is %d bytes, over %d", len(s), tasks.MaxSubjectLen)
		}
		s = cutBytes(s, tasks.MaxSubjectLen)
	}
	return s, nil
}
