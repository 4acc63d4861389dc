package api_test

import (
	"fmt"
	"math/rand/v2"
	"regexp/syntax"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
)

// schemaGen makes JSON values from the OpenAPI document's schemas, seeded:
// values meant to be valid (strings from each pattern, lengths, enums,
// consts, examples, required and optional properties, propertyNames), and
// mutations of them meant to be invalid. It does not have to be right: the
// conformance test asks kin-openapi whether each request is valid and
// judges the server by that answer.
type schemaGen struct {
	r *rand.Rand
}

// value is a value for s.
func (g *schemaGen) value(s *openapi3.Schema) any {
	switch {
	case len(s.OneOf) > 0:
		return g.value(s.OneOf[g.r.IntN(len(s.OneOf))].Value)
	case s.Const != nil:
		return s.Const
	case len(s.Enum) > 0:
		return s.Enum[g.r.IntN(len(s.Enum))]
	case len(s.Examples) > 0 && g.r.IntN(2) == 0:
		return s.Examples[g.r.IntN(len(s.Examples))]
	}
	switch {
	case s.Type.Is("object"):
		return g.object(s)
	case s.Type.Is("array"):
		n := int(s.MinItems) + g.r.IntN(4)
		if s.MaxItems != nil && uint64(n) > *s.MaxItems {
			n = int(*s.MaxItems)
		}
		out := make([]any, n)
		for i := range out {
			out[i] = g.value(s.Items.Value)
		}
		return out
	case s.Type.Is("integer"):
		lo, hi := 0, 1000
		if s.Min != nil {
			lo = int(*s.Min)
		}
		if s.Max != nil {
			hi = int(*s.Max)
		}
		return lo + g.r.IntN(hi-lo+1)
	case s.Type.Is("boolean"):
		return g.r.IntN(2) == 0
	}
	return g.str(s)
}

// object has every required property, each optional one with p = 0.35,
// and for a map schema (additionalProperties) up to four entries named by
// propertyNames.
func (g *schemaGen) object(s *openapi3.Schema) map[string]any {
	out := map[string]any{}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range s.Properties {
			if !yield(k) {
				return
			}
		}
	}) {
		if slices.Contains(s.Required, name) || g.r.Float64() < 0.35 {
			out[name] = g.value(s.Properties[name].Value)
		}
	}
	if ap := s.AdditionalProperties.Schema; ap != nil && ap.Value != nil {
		n := g.r.IntN(5)
		if s.MaxProps != nil && uint64(n) > *s.MaxProps {
			n = int(*s.MaxProps)
		}
		for range n {
			key := g.randText(1, 12)
			if s.PropertyNames != nil && s.PropertyNames.Value != nil {
				key = g.str(s.PropertyNames.Value)
			}
			out[key] = g.value(ap.Value)
		}
	}
	return out
}

// str is a string for s: from its pattern (anchored, or embedded in text
// when the pattern is not), within its lengths where it can.
func (g *schemaGen) str(s *openapi3.Schema) string {
	lo, hi := int(s.MinLength), 40
	if s.MaxLength != nil {
		hi = min(int(*s.MaxLength), 400)
	}
	if s.Format == "date-time" && s.Pattern == "" {
		return time.Now().Add(time.Duration(g.r.IntN(1e6)) * time.Second).UTC().Format(time.RFC3339)
	}
	var out string
	for range 20 {
		switch {
		case s.Pattern == "":
			out = g.randText(lo, min(hi, lo+30))
		case strings.HasPrefix(s.Pattern, "^"):
			out = g.regex(s.Pattern)
		default:
			out = g.randText(0, 10) + g.regex(s.Pattern) + g.randText(0, 10)
		}
		if n := utf8.RuneCountInString(out); n >= lo && n <= hi {
			break
		}
	}
	if g.r.IntN(50) == 0 && s.MaxLength != nil && s.Pattern == "" { // the bound itself
		out = strings.Repeat("é", int(*s.MaxLength))
	}
	return out
}

// pieces the random text is made of: ASCII, accents, a CJK character, an
// emoji, spaces.
var textRunes = []rune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-_/~'!?éüß中📦")

func (g *schemaGen) randText(lo, hi int) string {
	n := lo
	if hi > lo {
		n += g.r.IntN(hi - lo + 1)
	}
	var b strings.Builder
	for range n {
		b.WriteRune(textRunes[g.r.IntN(len(textRunes))])
	}
	return b.String()
}

// regex is a string that matches pattern (Go's regexp/syntax, which reads
// the ECMA-262 subset the document uses the same way).
func (g *schemaGen) regex(pattern string) string {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		panic(fmt.Sprintf("pattern %q: %v", pattern, err))
	}
	var b strings.Builder
	g.walk(&b, re.Simplify())
	return b.String()
}

func (g *schemaGen) walk(b *strings.Builder, re *syntax.Regexp) {
	switch re.Op {
	case syntax.OpLiteral:
		b.WriteString(string(re.Rune))
	case syntax.OpCharClass:
		b.WriteRune(g.classRune(re.Rune))
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		b.WriteRune(textRunes[g.r.IntN(len(textRunes))])
	case syntax.OpCapture:
		g.walk(b, re.Sub[0])
	case syntax.OpConcat:
		for _, s := range re.Sub {
			g.walk(b, s)
		}
	case syntax.OpAlternate:
		g.walk(b, re.Sub[g.r.IntN(len(re.Sub))])
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		lo, hi := re.Min, re.Max
		switch re.Op {
		case syntax.OpStar:
			lo, hi = 0, 4
		case syntax.OpPlus:
			lo, hi = 1, 5
		case syntax.OpQuest:
			lo, hi = 0, 1
		}
		if hi < 0 || hi > lo+8 {
			hi = lo + g.r.IntN(9)
		}
		n := lo + g.r.IntN(hi-lo+1)
		for range n {
			g.walk(b, re.Sub[0])
		}
	}
}

// classRune picks a rune of a character class (pairs of ranges), mostly
// printable ASCII where the class has it, never a surrogate.
func (g *schemaGen) classRune(ranges []rune) rune {
	if g.r.IntN(10) < 7 {
		for range 16 {
			c := rune(0x20 + g.r.IntN(0x5f))
			for i := 0; i+1 < len(ranges); i += 2 {
				if c >= ranges[i] && c <= ranges[i+1] {
					return c
				}
			}
		}
	}
	for {
		i := 2 * g.r.IntN(len(ranges)/2)
		lo, hi := ranges[i], min(ranges[i+1], 0x2FFFF)
		if hi < lo {
			continue
		}
		c := lo + rune(g.r.IntN(int(hi-lo)+1))
		if c < 0xD800 || c > 0xDFFF {
			return c
		}
	}
}

// mutate changes one thing of a valid notification so that it is most
// likely invalid: a required field gone, a wrong type, a bad string, an
// unknown member, a bad or reserved header, both ttl and expires_at.
func (g *schemaGen) mutate(n map[string]any) (map[string]any, string) {
	out := map[string]any{}
	for k, v := range n {
		out[k] = v
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range out {
			if !yield(k) {
				return
			}
		}
	})
	pick := keys[g.r.IntN(len(keys))]
	switch g.r.IntN(11) {
	case 0:
		delete(out, []string{"to", "body", "channel", "subject"}[g.r.IntN(4)])
		return out, "required field removed"
	case 1:
		out[pick] = []any{12, true, nil, map[string]any{"a": 1}}[g.r.IntN(4)]
		return out, "wrong type of " + pick
	case 2:
		out[pick] = "x\r\nBcc: victim@example.com"
		return out, "CR/LF in " + pick
	case 3:
		out[pick] = ""
		return out, "empty " + pick
	case 4:
		out[pick] = strings.Repeat("é", 1700)
		return out, "long " + pick
	case 5:
		out[[]string{"colour", "a/b", "x~y", "ID", "enqueued_at"}[g.r.IntN(5)]] = "x"
		return out, "unknown member"
	case 6:
		name := []string{"Bcc", "content-type", "X-Sluice-Tenant", "bad name", "X/Y", "X~Y", "é", ""}[g.r.IntN(8)]
		out["headers"] = map[string]any{name: "v", "X-Ok": []string{"", " ", "a\x01b", "ok"}[g.r.IntN(4)]}
		return out, "bad header " + name
	case 7:
		out["ttl"], out["expires_at"] = "1h", "2099-01-01T00:00:00Z"
		return out, "ttl and expires_at"
	case 8:
		out["channel"] = []string{"fax", "SMS", "Email", ""}[g.r.IntN(4)]
		return out, "bad channel"
	case 9:
		out["to"] = []string{"ann", "Ann <ann@example.com>", "+0123", "1415555010", "ann@localhost", "+1 (415) 555-0100"}[g.r.IntN(6)]
		return out, "bad to"
	}
	out["ttl"] = []string{"0s", "-1h", "1.5h", "1d", "10", "9601h", "1ms", "h"}[g.r.IntN(8)]
	return out, "bad ttl"
}
