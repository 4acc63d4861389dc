package digest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// Templates that would take the process down — by output, by loops that
// write nothing, by values grown without writing, by recursion — are
// refused when they are set, each at one of the box's limits (issue 50).
func TestTemplateBombsRefusedAtSetTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		ch    tasks.Channel
		tmpl  digest.Template
		limit bool // refused at a limit (ErrLimit), not at parse
	}{
		{"OutputBomb", tasks.SMS, digest.Template{Text: "{{range 1000000000}}x{{end}}"}, true},
		{"ThirtyMegabytes", tasks.Email, digest.Template{Text: "{{range 300000}}" + strings.Repeat("y", 100) + "{{end}}"}, true},
		{"GrowsWithItems", tasks.Email, digest.Template{Text: "{{range .Items}}{{range $.Items}}{{range $.Items}}{{range 2000}}xxxxxxxxxx{{end}}{{end}}{{end}}{{end}}"}, true},
		{"QuietLoop", tasks.Email, digest.Template{Text: "{{range 1000000000}}{{end}}"}, true},
		{"HTMLBomb", tasks.Email, digest.Template{HTML: "{{range 1000000000}}<b>x</b>{{end}}"}, true},
		{"SubjectBomb", tasks.Email, digest.Template{Subject: "{{range 1000000000}}x{{end}}"}, true},
		{"DoublingVariable", tasks.Email, digest.Template{Text: `{{$a := printf "%999999d" 1}}` + strings.Repeat(`{{$a = printf "%s%s" $a $a}}`, 40) + `{{len $a}}`}, true},
		{"EscaperGrowth", tasks.Email, digest.Template{Text: `{{$a := printf "%999999s" "&"}}` + strings.Repeat(`{{$a = html $a $a}}`, 40)}, true},
		{"Recursion", tasks.Email, digest.Template{Text: `{{define "a"}}{{template "a" .}}{{template "a" .}}{{end}}{{template "a" .}}`}, false},
		{"Block", tasks.Email, digest.Template{Text: `{{block "b" .}}x{{end}}`}, false},
		{"Call", tasks.Email, digest.Template{Text: `{{call .First.EnqueuedAt.String}}`}, false},
		{"MethodOnAVariable", tasks.Email, digest.Template{Text: `{{$l := "1"}}{{.First.EnqueuedAt.Format $l}}`}, false},
		{"MethodInAPipeline", tasks.Email, digest.Template{Text: `{{"1" | .First.EnqueuedAt.Format}}`}, false},
		{"SubjectCRLF", tasks.Email, digest.Template{Subject: "Hi\r\nBcc: x@example.com"}, false},
		{"SubjectNEL", tasks.Email, digest.Template{Subject: "Hi\u0085there"}, false},
		{"SubjectLineSeparator", tasks.Email, digest.Template{Subject: "Hi\u2028there"}, false},
		{"SubjectMadeCR", tasks.Email, digest.Template{Subject: `Hi{{printf "%c" 13}}Bcc: x`}, true},
		{"SubjectTooLong", tasks.Email, digest.Template{Subject: "{{range .Items}}abc{{end}}"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.tmpl.Check(tc.ch)
			if !errors.Is(err, digest.ErrBadTemplate) {
				t.Fatalf("Check: %v, want ErrBadTemplate", err)
			}
			if tc.limit != errors.Is(err, digest.ErrLimit) {
				t.Errorf("Check: %v; at a limit: %v, want %v", err, errors.Is(err, digest.ErrLimit), tc.limit)
			}
		})
	}
}

// What a template may do stays allowed: listing every item of the largest
// digest, their metadata, their times with a literal layout, printf.
func TestTemplatesWithinTheBox(t *testing.T) {
	t.Parallel()
	for _, tmpl := range []digest.Template{
		{Text: "{{.Count}} alerts: {{range .Items}}{{.Body}}; {{end}}"},
		{Text: `{{range $i, $it := .Items}}{{if lt $i 5}}{{$it.EnqueuedAt.Format "15:04"}} {{printf "%.20s" $it.Body}}{{range $k, $v := $it.Metadata}} {{$k}}={{$v}}{{end}}
{{end}}{{end}}{{.Items}} {{.First}} {{.First.Metadata}}`},
	} {
		if err := tmpl.Check(tasks.SMS); err != nil {
			t.Errorf("%q: %v", tmpl.Text, err)
		}
	}
	email := digest.Template{Subject: `{{.Count}} new comments{{if .More}} ({{.More}} more){{end}}`,
		Text: "{{range .Items}}{{.Subject}}\n{{.Body}}\n\n{{end}}", HTML: `<ol>{{range .Items}}<li>{{.Body}}</li>{{end}}</ol>`}
	if err := email.Check(tasks.Email); err != nil {
		t.Error(err)
	}
	if digest.SampleItems != plans.MaxDigestItems {
		t.Errorf("the sample digest has %d items, want the most a rule or plan may set, %d", digest.SampleItems, plans.MaxDigestItems)
	}
}

// At send time the items are real: a template that fits the sample but
// not the digest it is given fails that render at a limit; the built-in
// templates cut instead.
func TestSendTimeRenderPastALimit(t *testing.T) {
	t.Parallel()
	tmpl := &digest.Template{Text: "{{range .Items}}{{.Body}}{{.Body}}{{.Body}}{{end}}"}
	if err := tmpl.Check(tasks.Email); err != nil {
		t.Fatal(err)
	}
	var items []tasks.Notification
	for i := range 40 {
		items = append(items, tasks.NewEmail("acme", "jane@example.com", fmt.Sprintf("s%d", i), strings.Repeat("z", 10_000)))
	}
	if _, err := digest.RenderWith(items[0], items, tmpl); !errors.Is(err, digest.ErrLimit) {
		t.Fatalf("40 items of 10 kB, each three times (1.2 MB): %v, want ErrLimit", err)
	}
	var big []tasks.Notification
	for i := range 8 {
		big = append(big, tasks.NewEmail("acme", "jane@example.com", fmt.Sprintf("s%d", i), strings.Repeat("w", 200<<10)))
	}
	m, err := digest.Render(big[0], big)
	if err != nil {
		t.Fatalf("the built-in template on 1.6 MB of items: %v, want it cut", err)
	}
	if len(m.Body) > digest.DefaultLimits.Bytes || !strings.HasSuffix(m.Body, "…") {
		t.Errorf("built-in text: %d bytes, suffix %q; want at most %d, cut", len(m.Body), m.Body[len(m.Body)-5:], digest.DefaultLimits.Bytes)
	}
}

// Any template text: Check never panics and returns in bounded time; one
// it accepts renders a small digest without a panic, within the box's
// output limit, and its subject is a header field.
func FuzzTemplateCheck(f *testing.F) {
	for _, s := range []string{"{{.Count}} new", "{{range .Items}}{{.Body}}{{end}}", "{{range 1000000000}}x{{end}}",
		`{{define "a"}}{{template "a"}}{{end}}`, `{{printf "%999999d" 1}}`, `{{$a := "x"}}{{range 20}}{{$a = printf "%s%s" $a $a}}{{end}}`,
		"{{.First.EnqueuedAt.Format \"15:04\"}}", "{{with .First}}{{.Metadata.thread}}{{end}}", "{{call .X}}", "{{range .Items}}{{break}}{{end}}", "{{if false}}x{{end}}"} {
		f.Add(s, s)
	}
	items := []tasks.Notification{tasks.NewEmail("acme", "a@example.com", "one", "body one"), tasks.NewEmail("acme", "a@example.com", "two", "body two")}
	for i := range items {
		items[i].Metadata = map[string]string{"thread": "t"}
	}
	f.Fuzz(func(t *testing.T, subject, text string) {
		tmpl := digest.Template{Subject: subject, Text: text}
		if err := tmpl.Check(tasks.Email); err != nil {
			if !errors.Is(err, digest.ErrBadTemplate) {
				t.Fatalf("Check: %v, not ErrBadTemplate", err)
			}
			return
		}
		m, err := digest.RenderWith(items[0], items, &tmpl)
		if err != nil {
			return // a missing key, an index out of range: the items are not the sample's
		}
		if len(m.Body) > digest.DefaultLimits.Bytes || len(m.Subject) > tasks.MaxSubjectLen {
			t.Fatalf("rendered %d bytes of text, %d of subject", len(m.Body), len(m.Subject))
		}
		if err := m.Validate(); err != nil && strings.Contains(err.Error(), "subject") {
			t.Fatalf("the rendered subject is no header field: %v", err)
		}
	})
}
