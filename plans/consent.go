package plans

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
)

// Opt-out scopes (KindOptOut): what an opt-out by keyword or one-click
// unsubscribe covers.
const (
	// OptOutAll: every category of the channel but those declared
	// consent=exempt (the FCC's "revoke-all" rule, in force from 31
	// January 2027). The default.
	OptOutAll = "all"
	// OptOutCategory: the category of the message the recipient answers:
	// for SMS the category last admitted to them (remembered for
	// LastCategoryTTL), else every category; for a one-click unsubscribe
	// the email's category.
	OptOutCategory = "category"
)

// The replies a tenant can set (KindReply): sent once to a recipient who
// texts an opt-out, opt-in or help keyword, through the priority lane.
const (
	ReplyStop  = "stop"
	ReplyStart = "start"
	ReplyHelp  = "help"
)

// The keyword lists a tenant can add to (KindKeywords).
const (
	KeywordsStop  = "stop"
	KeywordsStart = "start"
	KeywordsHelp  = "help"
)

// MaxReplyBytes bounds a reply text: one SMS segment of GSM-7 at most is
// the aim, 320 bytes (two segments) the limit.
const MaxReplyBytes = 320

// parseConsentExempt reads [TENANT/]CHANNEL.CATEGORY:consent=exempt: the
// category goes after an opt-out of every category.
func parseConsentExempt(e Entry, t entryText) (Entry, error) {
	if t.value != "exempt" {
		return e, fmt.Errorf("consent=%q: want consent=exempt", t.value)
	}
	if e.Category == "" {
		return e, errors.New("consent=exempt needs a category (e.g. sms.otp:consent=exempt): an opt-out of every category still lets that category through")
	}
	e.Kind = KindConsentExempt
	return e, nil
}

// parseOptOut reads [TENANT/]CHANNEL:optout=all|category: what an opt-out
// covers.
func parseOptOut(e Entry, t entryText) (Entry, error) {
	if t.value != OptOutAll && t.value != OptOutCategory {
		return e, fmt.Errorf("optout=%q: want %s or %s", t.value, OptOutAll, OptOutCategory)
	}
	if e.Category != "" {
		return e, errors.New("optout= is set per channel (e.g. sms:optout=category), not per category")
	}
	e.Kind, e.OptOut = KindOptOut, t.value
	return e, nil
}

// parseReply reads [TENANT/]sms:reply-stop|start|help=TEXT: the reply to a
// keyword (%2C for a comma).
func parseReply(e Entry, t entryText) (Entry, error) {
	which, err := smsKeyword(e, t, "reply-", "TEXT", ReplyStop, ReplyStart, ReplyHelp)
	if err != nil {
		return e, err
	}
	text, err := url.PathUnescape(t.value)
	if err != nil {
		return e, fmt.Errorf("%s: %w (write a comma as %%2C, a # as %%23, a %% as %%25)", t.word, err)
	}
	text = strings.TrimSpace(text) // as the rule list trims a value: what prints parses back the same
	if len(text) > MaxReplyBytes || strings.TrimSpace(text) == "" {
		return e, fmt.Errorf("%s: the text must be 1–%d bytes", t.word, MaxReplyBytes)
	}
	e.Kind, e.Reply, e.Text = KindReply, which, text
	return e, nil
}

// parseKeywords reads [TENANT/]sms:keywords-stop|start|help=WORD WORD: words
// added to the standard ones.
func parseKeywords(e Entry, t entryText) (Entry, error) {
	which, err := smsKeyword(e, t, "keywords-", "WORD WORD", KeywordsStop, KeywordsStart, KeywordsHelp)
	if err != nil {
		return e, err
	}
	words := strings.Fields(t.value)
	var k consent.Keywords
	switch which {
	case KeywordsStop:
		k.OptOut = words
	case KeywordsStart:
		k.OptIn = words
	default:
		k.Help = words
	}
	if err := k.Validate(); err != nil {
		return e, err
	}
	e.Kind, e.Reply, e.Words = KindKeywords, which, words
	return e, nil
}

// smsKeyword checks what reply- and keywords- entries share and returns
// the keyword the word names after prefix (stop, start or help): the
// keyword is one of them, the entry has a value (shaped like shape), and
// it is set for sms, per channel.
func smsKeyword(e Entry, t entryText, prefix, shape, stop, start, help string) (string, error) {
	which := strings.TrimPrefix(t.word, prefix)
	if which != stop && which != start && which != help {
		return "", fmt.Errorf("%s: want %s%s, %s%s or %s%s", t.word, prefix, stop, prefix, start, prefix, help)
	}
	if !t.hasValue || t.value == "" {
		return "", fmt.Errorf("%s needs a value", t.word)
	}
	if e.Channel != tasks.SMS || e.Category != "" {
		return "", fmt.Errorf("%s is for sms, per channel (e.g. sms:%s=%s)", t.word, t.word, shape)
	}
	return which, nil
}

// consentString writes a consent entry's part after ':'.
func (e Entry) consentString() string {
	switch e.Kind {
	case KindConsentExempt:
		return "consent=exempt"
	case KindOptOut:
		return "optout=" + e.OptOut
	case KindReply:
		r := strings.NewReplacer("%", "%25", ",", "%2C", "#", "%23", "\n", "%0A")
		return "reply-" + e.Reply + "=" + r.Replace(e.Text)
	case KindKeywords:
		return "keywords-" + e.Reply + "=" + strings.Join(e.Words, " ")
	}
	return ""
}

// Consent is what a tenant's rules say about consent on one channel.
type Consent struct {
	// OptOut is the scope of an opt-out: OptOutAll or OptOutCategory.
	OptOut string
	// Replies are the tenant's reply texts by ReplyStop, ReplyStart,
	// ReplyHelp; a keyword without one gets no reply.
	Replies map[string]string
	// Keywords are the tenant's words besides the standard ones.
	Keywords consent.Keywords
}

// Consent returns what the policy says about consent for tenant on ch:
// the tenant's entries win over the defaults of the same kind.
func (p Policy) Consent(tenant string, ch tasks.Channel) Consent {
	c := Consent{OptOut: OptOutAll}
	pick := func(kind Kind, sub string) (Entry, bool) {
		var found Entry
		ok := false
		for _, e := range p.entries {
			if e.Kind != kind || e.Channel != ch || e.Reply != sub || (e.Tenant != "" && e.Tenant != tenant) {
				continue
			}
			if !ok || e.Tenant != "" {
				found, ok = e, true
			}
		}
		return found, ok
	}
	if e, ok := pick(KindOptOut, ""); ok {
		c.OptOut = e.OptOut
	}
	for _, r := range []string{ReplyStop, ReplyStart, ReplyHelp} {
		if e, ok := pick(KindReply, r); ok {
			if c.Replies == nil {
				c.Replies = map[string]string{}
			}
			c.Replies[r] = e.Text
		}
		if e, ok := pick(KindKeywords, r); ok {
			switch r {
			case KeywordsStop:
				c.Keywords.OptOut = slices.Clone(e.Words)
			case KeywordsStart:
				c.Keywords.OptIn = slices.Clone(e.Words)
			default:
				c.Keywords.Help = slices.Clone(e.Words)
			}
		}
	}
	return c
}

// ConsentExempt reports whether tenant declares category of ch one that an
// opt-out of every category lets through (CHANNEL.CATEGORY:consent=exempt),
// and the reserved category of Sluice's own replies to keywords.
func (p Policy) ConsentExempt(tenant string, ch tasks.Channel, category string) bool {
	if category == ReplyCategory {
		return true
	}
	for _, e := range p.entries {
		if e.Kind == KindConsentExempt && e.Channel == ch && e.Category == category && (e.Tenant == "" || e.Tenant == tenant) {
			return true
		}
	}
	return false
}

// ReplyCategory is the category of Sluice's replies to keywords (the one
// confirmation of an opt-out, a help text): exempt from an opt-out of every
// category, as 47 CFR 64.1200(a)(12) allows the confirmation.
const ReplyCategory = "consent-reply"
