package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// readmeMaxBytes bounds README.md (as `wc -c` counts it): the README is the
// entry point, the depth lives in docs/. 15 KB read as 15,000 bytes, the
// stricter of the two readings.
const readmeMaxBytes = 15_000

// The README stays an entry point.
func TestDocsReadmeSize(t *testing.T) {
	t.Parallel()
	if err := checkReadmeSize(os.DirFS("../..")); err != nil {
		t.Error(err)
	}
}

// Every relative link of README.md and docs/*.md leads to a file that exists
// and, with a #fragment into a Markdown page, to a heading that exists.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	for _, err := range checkDocLinks(os.DirFS("../..")) {
		t.Error(err)
	}
}

// Every page under docs/ can be found from the README by following links.
func TestDocsReachable(t *testing.T) {
	t.Parallel()
	for _, err := range checkDocsReachable(os.DirFS("../..")) {
		t.Error(err)
	}
}

// The checks above catch what they are for: a tree with one fault of each
// kind fails each check, and the same tree without the faults passes.
func TestDocsChecksCatchFaults(t *testing.T) {
	t.Parallel()
	good := fstest.MapFS{
		"README.md": {Data: []byte("# Sluice\n\nSee [rules](docs/rules.md#quiet-hours), [the API](docs/api.md) and ![x](docs/a.png).\n" +
			"```\n[not a link](docs/nowhere.md)\n```\n`[nor this](docs/nowhere.md)`, ``a ` [nor](docs/nowhere.md) ``\n[Top](#sluice)\n")},
		"docs/rules.md": {Data: []byte("# Rules\n\nBack to the [README](../README.md).\n\n## Quiet hours\n\n## Limits — and `when_not` (2×)\n\n## Limits — and `when_not` (2×)\n")},
		"docs/api.md":   {Data: []byte("# API\n\n[Limits](rules.md#limits--and-when_not-2) and [again](rules.md#limits--and-when_not-2-1).\n")},
		"docs/a.png":    {Data: []byte("png")},
	}
	if err := checkReadmeSize(good); err != nil {
		t.Errorf("good tree: %v", err)
	}
	if errs := checkDocLinks(good); len(errs) > 0 {
		t.Errorf("good tree: %v", errs)
	}
	if errs := checkDocsReachable(good); len(errs) > 0 {
		t.Errorf("good tree: %v", errs)
	}

	with := func(name, data string) fstest.MapFS {
		bad := fstest.MapFS{}
		for k, v := range good {
			bad[k] = v
		}
		bad[name] = &fstest.MapFile{Data: []byte(data)}
		return bad
	}
	if err := checkReadmeSize(with("README.md", strings.Repeat("x", readmeMaxBytes+1))); err == nil {
		t.Error("an oversized README passed")
	}
	for name, tc := range map[string]struct{ file, data, want string }{
		"MissingFile":       {"docs/api.md", "# API\n[gone](channels.md)\n", `docs/api.md: link "channels.md": docs/channels.md does not exist`},
		"MissingAnchor":     {"docs/api.md", "# API\n[gone](rules.md#quiet-hour)\n", `docs/api.md: link "rules.md#quiet-hour": docs/rules.md has no heading #quiet-hour`},
		"MissingSelfAnchor": {"README.md", "# Sluice\n[x](docs/rules.md) [y](docs/api.md) [z](#layout)\n", `README.md: link "#layout": README.md has no heading #layout`},
		"MissingImage":      {"docs/api.md", "# API\n![shot](dashboard.png)\n", `docs/api.md: link "dashboard.png": docs/dashboard.png does not exist`},
	} {
		errs := checkDocLinks(with(tc.file, tc.data))
		if !slices.ContainsFunc(errs, func(err error) bool { return err.Error() == tc.want }) {
			t.Errorf("%s: got %v, want %q", name, errs, tc.want)
		}
	}
	orphan := with("docs/orphan.md", "# Orphan\n[back](../README.md)\n")
	if errs := checkDocsReachable(orphan); len(errs) != 1 || !strings.Contains(errs[0].Error(), "docs/orphan.md") {
		t.Errorf("an unreachable page: got %v", errs)
	}
}

// The anchors GitHub gives headings: lowercase, spaces to '-', punctuation
// dropped (letters, digits, '-' and '_' kept), repeats numbered.
func TestDocsHeadingAnchors(t *testing.T) {
	t.Parallel()
	page := "# Sluice\n## Quick start\n## When to use a sliding log — and when not\n" +
		"## Replica-acknowledged admissions (`SLUICE_REDIS_WAIT_REPLICAS=1`)\n## Issue 19: lanes and shards\n" +
		"### DKIM and `sluice dkim record`\n## [Linked](x.md) **bold** heading ##\n## Quick start\n" +
		"```sh\n# not a heading\n```\n    # nor this\n#nor this\n"
	want := []string{"sluice", "quick-start", "when-to-use-a-sliding-log--and-when-not",
		"replica-acknowledged-admissions-sluice_redis_wait_replicas1", "issue-19-lanes-and-shards",
		"dkim-and-sluice-dkim-record", "linked-bold-heading", "quick-start-1"}
	if got := headingAnchors(page); !slices.Equal(got, want) {
		t.Errorf("anchors\n got %q\nwant %q", got, want)
	}
}

func checkReadmeSize(fsys fs.FS) error {
	raw, err := fs.ReadFile(fsys, "README.md")
	if err != nil {
		return err
	}
	if len(raw) > readmeMaxBytes {
		return fmt.Errorf("README.md is %d bytes, more than %d: it is the entry point; move the depth to a page under docs/ and link it", len(raw), readmeMaxBytes)
	}
	return nil
}

// docPages are README.md and every Markdown file under docs/.
func docPages(fsys fs.FS) ([]string, error) {
	pages := []string{"README.md"}
	err := fs.WalkDir(fsys, "docs", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			pages = append(pages, p)
		}
		return err
	})
	return pages, err
}

var (
	fenceRe    = regexp.MustCompile("^ {0,3}(```|~~~)")
	linkRe     = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	htmlLinkRe = regexp.MustCompile(`(?i)<(?:a|img)\s[^>]*?(?:href|src)="([^"]*)"`)
	htmlIDRe   = regexp.MustCompile(`(?i)<a\s[^>]*?(?:id|name)="([^"]*)"`)
	schemeRe   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	inlineRe   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// outsideFences are the page's lines outside fenced code blocks.
func outsideFences(page string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(page, "\n") {
		if fenceRe.MatchString(line) {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// prose is the page without fenced code blocks and code spans, line by line.
func prose(page string) []string {
	lines := outsideFences(page)
	for i, line := range lines {
		lines[i] = withoutCodeSpans(line)
	}
	return lines
}

// withoutCodeSpans drops the line's code spans: a run of N backticks up to
// the next run of exactly N (CommonMark); an unmatched run stays as text.
func withoutCodeSpans(line string) string {
	var b strings.Builder
	for i := 0; i < len(line); {
		if line[i] != '`' {
			b.WriteByte(line[i])
			i++
			continue
		}
		n := 0
		for i+n < len(line) && line[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(line); {
			if line[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(line) && line[j+m] == '`' {
				m++
			}
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			b.WriteString(line[i : i+n])
			i += n
			continue
		}
		i = end
	}
	return b.String()
}

// links are the targets of the page's Markdown and HTML links and images.
func links(page string) []string {
	var out []string
	for _, line := range prose(page) {
		for _, m := range linkRe.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
		for _, m := range htmlLinkRe.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// headingAnchors are the fragment ids GitHub gives the page's ATX headings
// (and any <a id/name> in it), in order.
func headingAnchors(page string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range outsideFences(page) {
		for _, m := range htmlIDRe.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
		text, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		text = strings.TrimLeft(text, "#")
		if text != "" && text[0] != ' ' && text[0] != '\t' {
			continue // "#word" is not a heading
		}
		text = strings.TrimSpace(strings.TrimRight(strings.TrimSpace(text), "#"))
		text = inlineRe.ReplaceAllString(text, "$1")
		slug := githubSlug(text)
		if n, dup := seen[slug]; dup {
			seen[slug] = n + 1
			slug = fmt.Sprintf("%s-%d", slug, n+1)
		} else {
			seen[slug] = 0
		}
		out = append(out, slug)
	}
	return out
}

func githubSlug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// resolve turns a link of page into a file of fsys and a fragment; ok is
// false for links that leave the repository's files (http:, mailto:, …).
func resolve(page, link string) (file, fragment string, ok bool) {
	if schemeRe.MatchString(link) || strings.HasPrefix(link, "//") {
		return "", "", false
	}
	target, fragment, _ := strings.Cut(link, "#")
	if i := strings.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	if unescaped, err := url.PathUnescape(target); err == nil {
		target = unescaped
	}
	if target == "" {
		return page, fragment, true
	}
	if strings.HasPrefix(target, "/") {
		return path.Clean(strings.TrimPrefix(target, "/")), fragment, true
	}
	return path.Join(path.Dir(page), target), fragment, true
}

func checkDocLinks(fsys fs.FS) []error {
	pages, err := docPages(fsys)
	if err != nil {
		return []error{err}
	}
	anchors := map[string][]string{}
	anchorsOf := func(file string) ([]string, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		raw, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		anchors[file] = headingAnchors(string(raw))
		return anchors[file], nil
	}
	var errs []error
	for _, page := range pages {
		raw, err := fs.ReadFile(fsys, page)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, link := range links(string(raw)) {
			file, fragment, ok := resolve(page, link)
			if !ok {
				continue
			}
			if !fs.ValidPath(file) {
				errs = append(errs, fmt.Errorf("%s: link %q: %s is outside the repository", page, link, file))
				continue
			}
			if _, err := fs.Stat(fsys, file); err != nil {
				errs = append(errs, fmt.Errorf("%s: link %q: %s does not exist", page, link, file))
				continue
			}
			if fragment == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			a, err := anchorsOf(file)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: link %q: %w", page, link, err))
				continue
			}
			if !slices.Contains(a, fragment) {
				errs = append(errs, fmt.Errorf("%s: link %q: %s has no heading #%s", page, link, file, fragment))
			}
		}
	}
	return errs
}

func checkDocsReachable(fsys fs.FS) []error {
	pages, err := docPages(fsys)
	if err != nil {
		return []error{err}
	}
	reached := map[string]bool{"README.md": true}
	queue := []string{"README.md"}
	for len(queue) > 0 {
		page := queue[0]
		queue = queue[1:]
		raw, err := fs.ReadFile(fsys, page)
		if err != nil {
			continue // a missing page is checkDocLinks' to report
		}
		for _, link := range links(string(raw)) {
			if file, _, ok := resolve(page, link); ok && strings.HasSuffix(file, ".md") && !reached[file] {
				reached[file] = true
				queue = append(queue, file)
			}
		}
	}
	var errs []error
	for _, page := range pages {
		if !reached[page] {
			errs = append(errs, fmt.Errorf("%s is not reachable from README.md by links: link it from the README or a page the README reaches", page))
		}
	}
	return errs
}
