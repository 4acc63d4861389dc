package consent_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/consent"
)

var tenantWords = consent.Keywords{OptOut: []string{"BAJA", "Arrêt"}, OptIn: []string{"ALTA", "Sí"}, Help: []string{"AYUDA"}}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body    string
		intent  consent.Intent
		keyword string
	}{
		// The FCC's words, in any case and punctuation.
		{"STOP", consent.IntentOptOut, "STOP"},
		{"stop", consent.IntentOptOut, "STOP"},
		{" Stop. ", consent.IntentOptOut, "STOP"},
		{"STOP!!!", consent.IntentOptOut, "STOP"},
		{"\"stop\"", consent.IntentOptOut, "STOP"},
		{"Stop 🛑", consent.IntentOptOut, "STOP"},
		{"stop stop STOP", consent.IntentOptOut, "STOP"},
		{"ＳＴＯＰ", consent.IntentOptOut, "STOP"}, // fullwidth
		{"quit", consent.IntentOptOut, "QUIT"},
		{"End", consent.IntentOptOut, "END"},
		{"revoke", consent.IntentOptOut, "REVOKE"},
		{"opt out", consent.IntentOptOut, "OPT OUT"},
		{"Opt-Out", consent.IntentOptOut, "OPT OUT"},
		{"OPTOUT", consent.IntentOptOut, "OPT OUT"},
		{"opt\tout\n", consent.IntentOptOut, "OPT OUT"},
		{"cancel", consent.IntentOptOut, "CANCEL"},
		{"Unsubscribe.", consent.IntentOptOut, "UNSUBSCRIBE"},
		{"STOPALL", consent.IntentOptOut, "STOP"},
		{"stop all", consent.IntentOptOut, "STOP"},
		// The tenant's words.
		{"baja", consent.IntentOptOut, "BAJA"},
		{"ARRET", consent.IntentOptOut, "ARRET"},
		{"alta", consent.IntentOptIn, "ALTA"},
		{"si", consent.IntentOptIn, "SI"},
		{"Ayuda?", consent.IntentHelp, "AYUDA"},
		// Back in, and help.
		{"START", consent.IntentOptIn, "START"},
		{"unstop", consent.IntentOptIn, "UNSTOP"},
		{"Yes!", consent.IntentOptIn, "YES"},
		{"HELP", consent.IntentHelp, "HELP"},
		{"help?", consent.IntentHelp, "HELP"},
		{"info", consent.IntentHelp, "INFO"},
		// Not keywords, but read like a revocation: review.
		{"please stop texting me", consent.IntentReview, "STOP"},
		{"Stop please", consent.IntentReview, "STOP"},
		{"don't text me", consent.IntentReview, "DONT TEXT"},
		{"Don’t text me again", consent.IntentReview, "DONT TEXT"},
		{"do not contact me", consent.IntentReview, "DO NOT CONTACT"},
		{"No more messages!", consent.IntentReview, "NO MORE"},
		{"remove me from this list", consent.IntentReview, "REMOVE ME"},
		{"Wrong number", consent.IntentReview, "WRONG NUMBER"},
		{"leave me alone", consent.IntentReview, "LEAVE ME ALONE"},
		{"I want to cancel my subscription", consent.IntentReview, "CANCEL"},
		{"unsubscribe me now", consent.IntentReview, "UNSUBSCRIBE"},
		{"Please opt me out", consent.IntentReview, "OPT ME OUT"},
		{"not interested", consent.IntentReview, "NOT INTERESTED"},
		{"No más por favor", consent.IntentReview, "NO MAS"},
		{"darme de baja por favor", consent.IntentReview, "BAJA"},
		{"stahp", consent.IntentReview, "STAHP"},
		{"start stop", consent.IntentReview, "STOP"}, // not one keyword: a person decides
		// Ordinary replies.
		{"Thanks, see you tomorrow", consent.IntentNone, ""},
		{"Yes please, 3pm works", consent.IntentNone, ""},
		{"stopwatch", consent.IntentNone, ""},
		{"unstoppable", consent.IntentNone, ""},
		{"", consent.IntentNone, ""},
		{"?!", consent.IntentNone, ""},
		{"👍", consent.IntentNone, ""},
	} {
		got := consent.Classify(tc.body, tenantWords)
		if got.Intent != tc.intent || got.Keyword != tc.keyword {
			t.Errorf("Classify(%q) = %v %q, want %v %q", tc.body, got.Intent, got.Keyword, tc.intent, tc.keyword)
		}
	}
	// Without the tenant's words, theirs are ordinary (or for review).
	if got := consent.Classify("alta", consent.Keywords{}); got.Intent != consent.IntentNone {
		t.Errorf("alta without tenant words: %v", got)
	}
	for _, body := range []string{"baja", "Arrêt", "ARRET!"} {
		if got := consent.Classify(body, consent.Keywords{}); got.Intent != consent.IntentReview {
			t.Errorf("%s without tenant words: %v", body, got)
		}
	}
}

func TestKeywordsValidate(t *testing.T) {
	t.Parallel()
	if err := tenantWords.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, k := range map[string]consent.Keywords{
		"empty word":           {OptOut: []string{"!!"}},
		"long word":            {Help: []string{strings.Repeat("A", consent.MaxKeywordLen+1)}},
		"opt-in is an opt-out": {OptIn: []string{"Stop"}},
		"help is opt-out":      {OptOut: []string{"baja"}, Help: []string{"BAJA"}},
		"help is a variant":    {Help: []string{"opt-out"}},
		"too many":             {OptOut: make([]string, consent.MaxKeywords+1)},
	} {
		if err := k.Validate(); !errors.Is(err, consent.ErrInvalid) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
}

func FuzzClassify(f *testing.F) {
	for _, s := range []string{"STOP", "stop!", "Opt-Out", "please stop texting me", "don't text me", "START", "help?",
		"ＳＴＯＰ", "No más", "stop stop", "", "\xff\xfe", "s\u0301top", "ﬀ", "İSTOP", "STOP" + strings.Repeat(" ", 9000) + "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		c := consent.Classify(body, tenantWords)
		if (c.Intent == consent.IntentNone) != (c.Keyword == "") {
			t.Fatalf("Classify(%q) = %v %q", body, c.Intent, c.Keyword)
		}
		if c.Keyword != "" && (consent.Normalize(c.Keyword) != c.Keyword || !utf8.ValidString(c.Keyword) || len(c.Keyword) > consent.MaxKeywordLen) {
			t.Fatalf("Classify(%q): keyword %q is not canonical", body, c.Keyword)
		}
		n := consent.Normalize(body)
		if consent.Normalize(n) != n || strings.Contains(n, "  ") || strings.TrimSpace(n) != n {
			t.Fatalf("Normalize(%q) = %q is not a fixed point", body, n)
		}
		// Case (in ASCII text: upper-casing other scripts can change what
		// they normalise to), punctuation and spacing around the message
		// do not matter.
		if len(body) > consent.MaxClassifyRead-4 {
			return // the variants would be cut elsewhere
		}
		variants := []string{" " + body + " !", "\"" + body + "\"."}
		if asciiOnly(body) {
			variants = append(variants, strings.ToUpper(body), strings.ToLower(body))
		}
		for _, v := range variants {
			if got := consent.Classify(v, tenantWords); got != c {
				t.Fatalf("Classify(%q) = %v, but Classify(%q) = %v", body, c, v, got)
			}
		}
	})
}

// asciiOnly reports whether s is all ASCII.
func asciiOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
