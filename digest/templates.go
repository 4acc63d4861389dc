package digest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"strings"
	"text/template"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
)

// Template is a tenant's digest message for one channel and category, in
// place of the built-in one: Go text/template for the subject, the text and
// an SMS, html/template (every value escaped) for the HTML part. Each is
// given a View. An empty field keeps the built-in one.
type Template struct {
	Subject string `json:"subject,omitempty"`
	Text    string `json:"text,omitempty"`
	HTML    string `json:"html,omitempty"`
	// Version counts the changes of this tenant's template of this
	// channel and category; At and By say when and who.
	Version int64     `json:"version"`
	At      time.Time `json:"at"`
	By      string    `json:"by,omitempty"`
}

// ErrBadTemplate: a template that does not parse, or fails on a sample
// digest. It is refused when set, never found at send time.
var ErrBadTemplate = errors.New("digest: bad template")

// templatesKey holds every tenant's digest templates: field
// "<tenant>/<channel>.<category>", a JSON Template.
const templatesKey = "sluice:{templates}:digest"

// maxTemplate bounds one template's text.
const maxTemplate = 64 << 10

func templateField(tenant string, ch tasks.Channel, category string) string {
	if category == "" {
		category = tasks.DefaultCategory
	}
	return tenant + "/" + string(ch) + "." + category
}

// compiled is a template parsed: nil fields keep the built-in ones.
type compiled struct {
	subject, text *template.Template
	html          *htmltemplate.Template
}

func (t Template) compile(ch tasks.Channel) (compiled, error) {
	var c compiled
	var err error
	if ch == tasks.SMS && (t.Subject != "" || t.HTML != "") {
		return c, fmt.Errorf("%w: an SMS digest has only a text", ErrBadTemplate)
	}
	for _, f := range []struct {
		name, src string
		to        **template.Template
	}{{"subject", t.Subject, &c.subject}, {"text", t.Text, &c.text}} {
		if f.src == "" {
			continue
		}
		if len(f.src) > maxTemplate {
			return c, fmt.Errorf("%w: %s is over %d bytes", ErrBadTemplate, f.name, maxTemplate)
		}
		if *f.to, err = template.New(f.name).Option("missingkey=error").Parse(f.src); err != nil {
			return c, fmt.Errorf("%w: %s: %w", ErrBadTemplate, f.name, err)
		}
	}
	if t.HTML != "" {
		if len(t.HTML) > maxTemplate {
			return c, fmt.Errorf("%w: html is over %d bytes", ErrBadTemplate, maxTemplate)
		}
		if c.html, err = htmltemplate.New("html").Option("missingkey=error").Parse(t.HTML); err != nil {
			return c, fmt.Errorf("%w: html: %w", ErrBadTemplate, err)
		}
	}
	return c, nil
}

// sample is the digest a template is tried on before it is stored.
func sample(ch tasks.Channel) []tasks.Notification {
	var out []tasks.Notification
	for i, s := range []string{"First", "Second", "Third"} {
		n := tasks.Notification{ID: fmt.Sprintf("sample-%d", i), Channel: ch, Subject: s + " subject", Body: s + " body",
			Metadata: map[string]string{"thread": "t-1"}, EnqueuedAt: time.Unix(1_800_000_000+int64(i), 0).UTC()}
		out = append(out, n)
	}
	return out
}

// Check parses t for ch and renders it on a sample digest of three items:
// ErrBadTemplate when either fails.
func (t Template) Check(ch tasks.Channel) error {
	c, err := t.compile(ch)
	if err != nil {
		return err
	}
	items := sample(ch)
	carrier := items[0]
	carrier.HTML = "<p>x</p>"
	if _, err := render(carrier, items, c); err != nil {
		return fmt.Errorf("%w: on a sample digest: %w", ErrBadTemplate, err)
	}
	return nil
}

// Templates stores the tenants' digest templates in Redis; the worker reads
// the one in force at each digest it sends, so a change holds from the next.
type Templates struct{ rdb redis.UniversalClient }

// NewTemplates returns the template store on rdb.
func NewTemplates(rdb redis.UniversalClient) *Templates { return &Templates{rdb: rdb} }

// Set checks t and stores it as tenant's template of ch and category,
// replacing the one it had; it returns it with its version.
func (s *Templates) Set(ctx context.Context, tenant string, ch tasks.Channel, category string, t Template, by string) (Template, error) {
	if err := tasks.CheckTenant(tenant); err != nil {
		return t, err
	}
	if category != "" {
		if err := tasks.CheckCategory(category); err != nil {
			return t, err
		}
	}
	if err := t.Check(ch); err != nil {
		return t, err
	}
	field := templateField(tenant, ch, category)
	old, err := s.Get(ctx, tenant, ch, category)
	if err != nil {
		return t, err
	}
	t.Version, t.At, t.By = 1, time.Now().UTC(), by
	if old != nil {
		t.Version = old.Version + 1
	}
	b, err := json.Marshal(t)
	if err != nil {
		return t, err
	}
	if err := s.rdb.HSet(ctx, templatesKey, field, b).Err(); err != nil {
		return t, fmt.Errorf("digest: store template: %w", err)
	}
	return t, nil
}

// Get returns tenant's template of ch and category, nil when none is set.
func (s *Templates) Get(ctx context.Context, tenant string, ch tasks.Channel, category string) (*Template, error) {
	b, err := s.rdb.HGet(ctx, templatesKey, templateField(tenant, ch, category)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("digest: read template: %w", err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%w: stored template %s: %w", ErrBadRecord, templateField(tenant, ch, category), err)
	}
	return &t, nil
}

// Delete removes tenant's template of ch and category (the built-in one
// holds again); it reports whether there was one.
func (s *Templates) Delete(ctx context.Context, tenant string, ch tasks.Channel, category string) (bool, error) {
	n, err := s.rdb.HDel(ctx, templatesKey, templateField(tenant, ch, category)).Result()
	if err != nil {
		return false, fmt.Errorf("digest: delete template: %w", err)
	}
	return n == 1, nil
}

// List returns every template, by "<tenant>/<channel>.<category>".
func (s *Templates) List(ctx context.Context) (map[string]Template, error) {
	all, err := s.rdb.HGetAll(ctx, templatesKey).Result()
	if err != nil {
		return nil, fmt.Errorf("digest: list templates: %w", err)
	}
	out := make(map[string]Template, len(all))
	for k, v := range all {
		var t Template
		if err := json.Unmarshal([]byte(v), &t); err != nil {
			return nil, fmt.Errorf("%w: stored template %s: %w", ErrBadRecord, k, err)
		}
		out[k] = t
	}
	return out, nil
}

// RenderWith is Render with t (nil: the built-in templates).
func RenderWith(carrier tasks.Notification, items []tasks.Notification, t *Template) (tasks.Notification, error) {
	var c compiled
	if t != nil {
		var err error
		if c, err = t.compile(carrier.Channel); err != nil {
			return carrier, err
		}
	}
	return render(carrier, items, c)
}

func execText(t *template.Template, v View) (string, error) {
	var b bytes.Buffer
	err := t.Execute(&b, v)
	return b.String(), err
}

// render is the digest message of items under c, the built-in templates
// where c has none.
func render(carrier tasks.Notification, items []tasks.Notification, c compiled) (tasks.Notification, error) {
	v := NewView(items)
	out := carrier
	out.TemplateID = ""
	pick := func(own, builtin *template.Template) *template.Template {
		if own != nil {
			return own
		}
		return builtin
	}
	if carrier.Channel == tasks.SMS {
		s, err := execText(pick(c.text, smsText), v)
		if err != nil {
			return carrier, err
		}
		out.Body = cut(s, tasks.MaxSMSRunes)
		return out, nil
	}
	s, err := execText(pick(c.subject, emailSubject), v)
	if err != nil {
		return carrier, err
	}
	out.Subject = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
	if out.Body, err = execText(pick(c.text, emailText), v); err != nil {
		return carrier, err
	}
	if carrier.HTML != "" {
		h := emailHTML
		if c.html != nil {
			h = c.html
		}
		var b bytes.Buffer
		if err := h.Execute(&b, v); err != nil {
			return carrier, err
		}
		out.HTML = b.String()
	}
	return out, nil
}
