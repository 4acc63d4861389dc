package keyspace

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// Match returns the row of the table whose key patterns match key; of
// several, the most specific: the one whose matching pattern has the most
// literal characters (a consent key also matches the windows' pattern,
// all placeholders).
func Match(key string) (Row, bool) {
	best, bestLit := -1, -1
	for i, r := range table {
		for _, p := range r.Keys {
			if lit := literalLen(p); lit > bestLit && compiled(p).MatchString(key) {
				best, bestLit = i, lit
			}
		}
	}
	if best < 0 {
		return Row{}, false
	}
	return table[best], true
}

// Matches reports whether one of the row's patterns matches key.
func (r Row) Matches(key string) bool {
	for _, p := range r.Keys {
		if compiled(p).MatchString(key) {
			return true
		}
	}
	return false
}

var (
	patternsMu sync.Mutex
	patterns   = map[string]*regexp.Regexp{}
)

// compiled is pattern's regular expression, compiled once.
func compiled(pattern string) *regexp.Regexp {
	patternsMu.Lock()
	defer patternsMu.Unlock()
	re, ok := patterns[pattern]
	if !ok {
		re = regexp.MustCompile(toRegexp(pattern))
		patterns[pattern] = re
	}
	return re
}

// alternatives are words a\|b\|c of a pattern.
var alternatives = regexp.MustCompile(`[A-Za-z0-9_-]+(?:\\\|[A-Za-z0-9_-]+)+`)

// toRegexp turns a pattern into an anchored regular expression:
// <placeholder> any run of characters, [ ] an optional part, a\|b one of
// the words.
func toRegexp(pattern string) string {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pattern); {
		if loc := alternatives.FindStringIndex(pattern[i:]); loc != nil && loc[0] == 0 {
			b.WriteString("(?:" + strings.Join(quoteAll(strings.Split(pattern[i:i+loc[1]], `\|`)), "|") + ")")
			i += loc[1]
			continue
		}
		switch c := pattern[i]; c {
		case '<':
			end := strings.IndexByte(pattern[i:], '>')
			if end < 0 {
				panic(fmt.Sprintf("keyspace: pattern %q: unclosed <", pattern))
			}
			b.WriteString(".*")
			i += end + 1
			continue
		case '[':
			b.WriteString("(?:")
		case ']':
			b.WriteString(")?")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
		i++
	}
	b.WriteString("$")
	return b.String()
}

func quoteAll(words []string) []string {
	for i, w := range words {
		words[i] = regexp.QuoteMeta(w)
	}
	return words
}

// literalLen counts pattern's characters outside placeholders.
func literalLen(pattern string) int { return len(notLiteral.ReplaceAllString(pattern, "")) }

var notLiteral = regexp.MustCompile(`<[^>]*>|[\[\]]`)

// Markdown renders the table as docs/architecture.md shows it.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| key | owner | written by | TTL |\n|---|---|---|---|\n")
	for _, r := range table {
		cell := "`" + strings.Join(r.Keys, "`, `") + "`"
		if r.Note != "" {
			cell += " " + r.Note
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell, r.Owner, r.WrittenBy, r.TTL)
	}
	return b.String()
}
