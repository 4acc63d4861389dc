package digest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/plans"
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
const templatesKey = keyspace.DigestTemplates

// maxTemplate bounds one template's text.
const maxTemplate = 64 << 10

func templateField(tenant string, ch tasks.Channel, category string) string {
	if category == "" {
		category = tasks.DefaultCategory
	}
	return tenant + "/" + string(ch) + "." + category
}

// check parses t for ch in a box: its size, its header field, what the
// box refuses (box.go).
func (t Template) check(ch tasks.Channel) error {
	if ch == tasks.SMS && (t.Subject != "" || t.HTML != "") {
		return fmt.Errorf("%w: an SMS digest has only a text", ErrBadTemplate)
	}
	for _, f := range []struct{ name, src string }{{"subject", t.Subject}, {"text", t.Text}, {"html", t.HTML}} {
		if len(f.src) > maxTemplate {
			return fmt.Errorf("%w: %s is over %d bytes", ErrBadTemplate, f.name, maxTemplate)
		}
		if !utf8.ValidString(f.src) {
			return fmt.Errorf("%w: %s is not valid UTF-8", ErrBadTemplate, f.name)
		}
	}
	if err := headerSafe(t.Subject); err != nil {
		return fmt.Errorf("%w: subject %w", ErrBadTemplate, err)
	}
	b := newBox(DefaultLimits)
	for _, f := range []struct{ name, src string }{{"subject", t.Subject}, {"text", t.Text}} {
		if f.src != "" {
			if _, err := parseText(f.name, f.src, b); err != nil {
				return err
			}
		}
	}
	if t.HTML != "" {
		if _, err := parseHTML("html", t.HTML, b); err != nil {
			return err
		}
	}
	return nil
}

// SampleItems is the size of the sample digest a template is tried on
// when it is set: the most items any digest rule or plan may give one
// digest (plans.MaxDigestItems), so a template that grows with its items
// is refused when it is set, not found at send time.
const SampleItems = plans.MaxDigestItems

// sample is the digest a template is tried on before it is stored.
func sample(ch tasks.Channel, n int) []tasks.Notification {
	out := make([]tasks.Notification, 0, n)
	names := []string{"First", "Second", "Third"}
	for i := range n {
		s := names[min(i, len(names)-1)]
		if i >= len(names) {
			s = fmt.Sprintf("Item %d", i+1)
		}
		out = append(out, tasks.Notification{ID: fmt.Sprintf("sample-%d", i), Channel: ch, Subject: s + " subject", Body: s + " body",
			Metadata: map[string]string{"thread": "t-1"}, EnqueuedAt: time.Unix(1_800_000_000+int64(i), 0).UTC()})
	}
	return out
}

// Check parses t for ch and renders it, in the box (DefaultLimits), on a
// sample digest of SampleItems items: ErrBadTemplate when either fails,
// wrapping ErrLimit when the render passed a limit.
func (t Template) Check(ch tasks.Channel) error {
	if err := t.check(ch); err != nil {
		return err
	}
	items := sample(ch, SampleItems)
	carrier := items[0]
	carrier.HTML = "<p>x</p>"
	if _, err := render(carrier, items, &t, DefaultLimits); err != nil {
		if errors.Is(err, ErrBadTemplate) {
			return err
		}
		return fmt.Errorf("%w: on a sample digest of %d items: %w", ErrBadTemplate, SampleItems, err)
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

// RenderWith is Render with t (nil: the built-in templates), in the box
// (DefaultLimits): an error wrapping ErrLimit when the render passed one
// of its limits — the digest fails (tasks.ReasonTemplate).
func RenderWith(carrier tasks.Notification, items []tasks.Notification, t *Template) (tasks.Notification, error) {
	if t != nil {
		if err := t.check(carrier.Channel); err != nil {
			return carrier, err
		}
	}
	return render(carrier, items, t, DefaultLimits)
}
