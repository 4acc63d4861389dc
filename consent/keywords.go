package consent

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// Intent is what an inbound SMS asks for.
type Intent int

// The intents, in the order Classify tries them.
const (
	// IntentNone: an ordinary reply, nothing to record.
	IntentNone Intent = iota
	// IntentOptOut: an opt-out keyword (STOP, QUIT, END, REVOKE, OPT OUT,
	// CANCEL, UNSUBSCRIBE, or one of the tenant's): suppress at once.
	IntentOptOut
	// IntentOptIn: START, UNSTOP, YES or one of the tenant's: lift it.
	IntentOptIn
	// IntentHelp: HELP, INFO or one of the tenant's: send the help reply.
	IntentHelp
	// IntentReview: not a keyword, but reads like a revocation ("please
	// stop texting me", "don't text me", "wrong number"): record it for a
	// person to decide; never ignore it silently.
	IntentReview
)

func (i Intent) String() string {
	switch i {
	case IntentNone:
		return "none"
	case IntentOptOut:
		return "opt-out"
	case IntentOptIn:
		return "opt-in"
	case IntentHelp:
		return "help"
	case IntentReview:
		return "review"
	}
	return fmt.Sprintf("Intent(%d)", int(i))
}

// FCCOptOutWords are the words 47 CFR 64.1200(a)(10) names: a reply using
// one of them revokes consent, and so must be honoured.
var FCCOptOutWords = []string{"STOP", "QUIT", "END", "REVOKE", "OPT OUT", "CANCEL", "UNSUBSCRIBE"}

// Bounds of Keywords and of what Classify reads.
const (
	MaxKeywordLen   = 32   // bytes of a keyword once normalised
	MaxKeywords     = 32   // words in each list of Keywords
	MaxClassifyRead = 8192 // bytes of a message Classify reads; the rest is ignored
)

// Keywords are a tenant's own words, besides the built-in ones. Each is
// matched as Normalize writes it, so "No más" and "NO MAS" are one word.
type Keywords struct {
	OptOut []string
	OptIn  []string
	Help   []string
}

// Validate reports a word that normalises to nothing or to more than
// MaxKeywordLen bytes, more than MaxKeywords in a list, and an opt-in or
// help word that is an opt-out word (the FCC's or the tenant's): an
// opt-out word always opts out. Errors wrap ErrInvalid.
func (k Keywords) Validate() error {
	optOut := map[string]bool{}
	for _, w := range FCCOptOutWords {
		optOut[w] = true
	}
	for w := range optOutVariants {
		optOut[w] = true
	}
	for _, list := range []struct {
		name  string
		words []string
	}{{"opt-out", k.OptOut}, {"opt-in", k.OptIn}, {"help", k.Help}} {
		if len(list.words) > MaxKeywords {
			return fmt.Errorf("%w: %d %s keywords, at most %d", ErrInvalid, len(list.words), list.name, MaxKeywords)
		}
		for _, w := range list.words {
			n := Normalize(w)
			if n == "" || len(n) > MaxKeywordLen {
				return fmt.Errorf("%w: %s keyword %q: want 1–%d bytes of letters and digits", ErrInvalid, list.name, w, MaxKeywordLen)
			}
			if list.name == "opt-out" {
				optOut[n] = true
			} else if optOut[n] {
				return fmt.Errorf("%w: %s keyword %q is an opt-out keyword, which always opts out", ErrInvalid, list.name, w)
			}
		}
	}
	return nil
}

// Classification is what Classify makes of a message.
type Classification struct {
	Intent Intent
	// Keyword is the keyword matched, canonical ("STOP" for "stop!!",
	// "OPT OUT" for "opt-out"), or for IntentReview the words that read
	// like a revocation ("DONT TEXT"). Empty for IntentNone. It is what
	// the ledger records (Event.Keyword), never the message itself.
	Keyword string
}

// optOutVariants are other spellings of the FCC's words, by canonical word.
var optOutVariants = map[string]string{"OPTOUT": "OPT OUT", "STOPALL": "STOP", "STOP ALL": "STOP", "UNSUBSCRIBE ALL": "UNSUBSCRIBE"}

var (
	optInWords = []string{"START", "UNSTOP", "YES"}
	helpWords  = []string{"HELP", "INFO"}
)

// revocationPhrases read like a revocation inside a longer message; with
// the opt-out words they make a message one for review.
var revocationPhrases = []string{
	"DONT TEXT", "DO NOT TEXT", "DONT MESSAGE", "DO NOT MESSAGE", "DONT SEND", "DO NOT SEND",
	"DONT CONTACT", "DO NOT CONTACT", "DONT CALL", "DO NOT CALL", "DONT WANT", "DO NOT WANT",
	"NO MORE", "LEAVE ME ALONE", "REMOVE ME", "TAKE ME OFF", "OPT ME OUT", "UNSUB", "UNSUBSCRIBED",
	"NOT INTERESTED", "WRONG NUMBER", "STOP TEXTING", "STOPP", "STAHP",
	// Spanish and French, common on US and Canadian numbers.
	"ALTO", "BASTA", "NO MAS", "CANCELAR", "DETENER", "BAJA", "ARRET", "ARRETER", "DESABONNER", "DESINSCRIRE",
}

// Normalize writes a message or keyword the way Classify compares them:
// compatibility forms folded (fullwidth "ＳＴＯＰ" is "STOP"), accents
// dropped ("más" is "MAS"), letters upper-cased, apostrophes removed
// ("don't" is "DONT"), every other run of punctuation, symbols and spaces
// one space, none at the ends.
func Normalize(s string) string {
	if len(s) > MaxClassifyRead {
		s = s[:MaxClassifyRead]
	}
	// A byte that is not UTF-8 separates words, as punctuation does:
	// decomposition stops at one, and what follows would not be read the
	// way it reads alone (found by FuzzClassify: "\xf0Ŏ" kept its breve).
	s = strings.ToValidUTF8(s, " ")
	var b strings.Builder
	space := false
	for _, r := range norm.NFKD.String(s) {
		switch {
		case unicode.Is(unicode.Mn, r):
			// a combining mark (an accent, once decomposed)
		case r == '\'' || r == '’' || r == 'ʼ' || r == '`' || r == '‘':
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if space && b.Len() > 0 {
				b.WriteByte(' ')
			}
			space = false
			b.WriteRune(unicode.ToUpper(r))
		default:
			space = true
		}
	}
	return b.String()
}

// Classify reads an inbound SMS body. A message that is, once normalised,
// an opt-out word (FCCOptOutWords, their spellings OPTOUT, STOPALL and
// STOP ALL, or one of k.OptOut) — alone or repeated ("STOP STOP") — is
// IntentOptOut; START, UNSTOP, YES or k.OptIn IntentOptIn; HELP, INFO or
// k.Help IntentHelp, tried in that order. A message that is none of them
// but holds an opt-out word or a phrase that reads like a revocation
// ("please stop texting me", "don't text me", "no more", "wrong number",
// "no más") is IntentReview. Anything else is IntentNone. Case,
// punctuation, spacing, accents and fullwidth forms do not matter. Classify
// is a pure function of its arguments; k is expected to be valid.
func Classify(body string, k Keywords) Classification {
	n := Normalize(body)
	if n == "" {
		return Classification{}
	}
	tokens := strings.Split(n, " ")
	whole := unrepeated(tokens)
	for _, w := range FCCOptOutWords {
		if whole == w {
			return Classification{IntentOptOut, w}
		}
	}
	if w, ok := optOutVariants[whole]; ok {
		return Classification{IntentOptOut, w}
	}
	for _, list := range []struct {
		intent  Intent
		builtin []string
		tenant  []string
	}{{IntentOptOut, nil, k.OptOut}, {IntentOptIn, optInWords, k.OptIn}, {IntentHelp, helpWords, k.Help}} {
		if slices.Contains(list.builtin, whole) {
			return Classification{list.intent, whole}
		}
		for _, w := range list.tenant {
			if Normalize(w) == whole {
				return Classification{list.intent, whole}
			}
		}
	}
	for _, w := range FCCOptOutWords {
		if hasPhrase(tokens, w) {
			return Classification{IntentReview, w}
		}
	}
	for w := range optOutVariants {
		if hasPhrase(tokens, w) {
			return Classification{IntentReview, optOutVariants[w]}
		}
	}
	for _, w := range k.OptOut {
		if nw := Normalize(w); nw != "" && hasPhrase(tokens, nw) {
			return Classification{IntentReview, nw}
		}
	}
	for _, p := range revocationPhrases {
		if hasPhrase(tokens, p) {
			return Classification{IntentReview, p}
		}
	}
	return Classification{}
}

// unrepeated returns the tokens as one phrase, or its first copy when the
// tokens are one phrase repeated ("STOP STOP", "OPT OUT OPT OUT").
func unrepeated(tokens []string) string {
	for size := 1; size <= len(tokens)/2; size++ {
		if len(tokens)%size != 0 {
			continue
		}
		same := true
		for i := size; i < len(tokens) && same; i++ {
			same = tokens[i] == tokens[i%size]
		}
		if same {
			return strings.Join(tokens[:size], " ")
		}
	}
	return strings.Join(tokens, " ")
}

// hasPhrase reports whether the words of phrase occur in tokens, in order
// and next to each other.
func hasPhrase(tokens []string, phrase string) bool {
	p := strings.Split(phrase, " ")
	for i := 0; i+len(p) <= len(tokens); i++ {
		if slices.Equal(tokens[i:i+len(p)], p) {
			return true
		}
	}
	return false
}
