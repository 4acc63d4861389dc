package plans_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

func TestConsentEntries(t *testing.T) {
	t.Parallel()
	p := mustParse(t, strings.Join([]string{
		"sms.otp:consent=exempt",
		"sms:optout=all",
		"acme/sms:optout=category",
		"sms:reply-stop=You are unsubscribed from Sluice texts%2C reply START to resume.",
		"acme/sms:reply-stop=Acme: no more texts. %23bye",
		"sms:reply-help=Help: support@example.com",
		"acme/sms:keywords-stop=BASTA ALTO",
		"email.news:unsubscribe=hosted",
	}, ","))
	if !p.ConsentExempt("acme", tasks.SMS, "otp") || p.ConsentExempt("acme", tasks.SMS, "marketing") || p.ConsentExempt("acme", tasks.Email, "otp") {
		t.Error("consent=exempt applies to its channel and category only")
	}
	if !p.ConsentExempt("anyone", tasks.SMS, plans.ReplyCategory) {
		t.Error("Sluice's own keyword replies are exempt")
	}
	acme, beta := p.Consent("acme", tasks.SMS), p.Consent("beta", tasks.SMS)
	if acme.OptOut != plans.OptOutCategory || beta.OptOut != plans.OptOutAll || p.Consent("beta", tasks.Email).OptOut != plans.OptOutAll {
		t.Errorf("opt-out scopes: acme %q, beta %q", acme.OptOut, beta.OptOut)
	}
	if acme.Replies[plans.ReplyStop] != "Acme: no more texts. #bye" || beta.Replies[plans.ReplyStop] != "You are unsubscribed from Sluice texts, reply START to resume." {
		t.Errorf("stop replies: acme %q, beta %q", acme.Replies[plans.ReplyStop], beta.Replies[plans.ReplyStop])
	}
	if acme.Replies[plans.ReplyHelp] != "Help: support@example.com" || acme.Replies[plans.ReplyStart] != "" {
		t.Errorf("acme's other replies: %v", acme.Replies)
	}
	if !slices.Equal(acme.Keywords.OptOut, []string{"BASTA", "ALTO"}) || beta.Keywords.OptOut != nil {
		t.Errorf("keywords: acme %v, beta %v", acme.Keywords.OptOut, beta.Keywords.OptOut)
	}
	if m := p.Match("acme", tasks.Email, "news"); !m.Hosted() || m.ListUnsubscribe(tasks.Notification{Channel: tasks.Email}) != "" {
		t.Errorf("hosted unsubscribe: %+v", m)
	}
	bulk := mustParse(t, "email.news:bulk,email.news:unsubscribe=hosted")
	if err := bulk.Match("acme", tasks.Email, "news").CheckUnsubscribe(tasks.Notification{Channel: tasks.Email, Category: "news"}); err != nil {
		t.Errorf("bulk mail with a hosted link: %v", err)
	}
	// Printed back, the same policy.
	if q := mustParse(t, p.String()); q.String() != p.String() {
		t.Errorf("reprint:\n%s\n%s", p.String(), q.String())
	}
	for _, bad := range []string{
		"sms:consent=exempt",       // no category
		"sms.otp:consent=yes",      // not exempt
		"sms.marketing:optout=all", // per channel
		"sms:optout=some",          // neither
		"email:reply-stop=bye",     // sms only
		"sms:reply-later=hi",       // no such reply
		"sms:reply-stop=",          // empty
		"sms:reply-stop=" + strings.Repeat("x", plans.MaxReplyBytes+1),
		"sms:reply-stop=100%",               // a bad escape
		"sms:keywords-start=STOP",           // an opt-out word cannot opt in
		"sms:reply-stop=a,sms:reply-stop=b", // twice
	} {
		if _, err := plans.Parse(bad); !errors.Is(err, plans.ErrBadRules) {
			t.Errorf("Parse(%q) = %v, want ErrBadRules", bad, err)
		}
	}
}
