package keyspace

import (
	"strings"
	"testing"
)

// Hashes as the limiter computed them at the commit before this package
// (secret "0123456789abcdef-keyspace"): throttle.Limiter.Subject of
// "+15550100", of "delivery-suppressions", of "" and of a digest's
// recipient and key; the compact member of "0f1e2d3c-id".
const (
	hRecipient = "zjPL_0AFlVFIdA3Cf7VuJA"
	hMigration = "S27ZYZOfyhahVZddXfxOEg"
	hEmail     = "bWWxZqRZ9nqAmrQr-d2yVg"
	hDigest    = "E47wl81R2ZRwDM2Lcns7GA"
	compactID  = "6pKPUzmMrXlFZvBD"
)

// Every builder gives, byte for byte, the key the code before this
// package built for the same parts: the literals below were printed by
// that code (throttle, consent, delivery, digest, api, webhook, plans,
// tasks, internal/orphans), so deployed data is found after the upgrade.
func TestKeysAsBefore(t *testing.T) {
	t.Parallel()
	def, sl9 := Space{}, Space{Prefix: "sl9"}
	due, bytes, total := Queued("acme")
	nlog, nsum := NotificationRate("tok1")
	q := AsynqQueue("notifications.sms.0")
	for got, want := range map[string]string{
		def.Window("acme", "sms:recipient", "60000", hRecipient):             "sl1:{acme}:sms:recipient:60000:zjPL_0AFlVFIdA3Cf7VuJA",
		Space{Prefix: "sl1"}.Window("acme", "sms.promo:tenant", "60000", ""): "sl1:{acme}:sms.promo:tenant:60000",
		def.Window("~shared", "sms:provider", "3600000d", ""):                "sl1:{%7Eshared}:sms:provider:3600000d",
		def.Window("api/tok1", "api:requests", "86400000~24", ""):            "sl1:{api%2Ftok1}:api:requests:86400000~24",
		sl9.Window("acme", "sms:recipient", "mo@UTC", hRecipient):            "sl9:{acme}:sms:recipient:mo@UTC:zjPL_0AFlVFIdA3Cf7VuJA",
		sl9.Window("~shared", "sms:provider", "86400000~24", ""):             "sl9:{%7Eshared}:sms:provider:86400000~24",
		def.State("acme", "0f1e2d3c-id"):                                     "sl1:{acme}:n:0f1e2d3c-id",
		def.State("acme", compactID):                                         "sl1:{acme}:n:6pKPUzmMrXlFZvBD",
		sl9.State("acme", compactID):                                         "sl9:{acme}:n:6pKPUzmMrXlFZvBD",
		def.Record("acme", "0f1e2d3c-id", RecordDelivery):                    "sl1:{acme}:n:0f1e2d3c-id:dlv",
		def.Record("acme", compactID, RecordFallback):                        "sl1:{acme}:n:6pKPUzmMrXlFZvBD:fb",
		sl9.Record("acme", compactID, RecordDigestItems):                     "sl9:{acme}:n:6pKPUzmMrXlFZvBD:dgi",
		def.Record("acme", "id1", RecordDigestOpened):                        "sl1:{acme}:n:id1:dgo",
		def.Record("acme", "id1", RecordDigestCarrier):                       "sl1:{acme}:n:id1:dg",
		def.Record("acme", "id1", RecordRecipient):                           "sl1:{acme}:n:id1:to",
		def.Record("acme", "id1", RecordProvider):                            "sl1:{acme}:n:id1:prv",
		def.Subject("acme", "consent:email", "HASHED"):                       "sl1:{acme}:consent:email:HASHED",
		def.Consent("acme", "sms", hRecipient):                               "sl1:{acme}:consent:sms:zjPL_0AFlVFIdA3Cf7VuJA",
		sl9.Consent("acme", "sms", hRecipient):                               "sl9:{acme}:consent:sms:zjPL_0AFlVFIdA3Cf7VuJA",
		def.Ledger("acme", "sms", hRecipient):                                "sl1:{acme}:ledger:sms:zjPL_0AFlVFIdA3Cf7VuJA",
		def.Last("acme", "email", hEmail):                                    "sl1:{acme}:last:email:bWWxZqRZ9nqAmrQr-d2yVg",
		def.Inbound("acme", "whatsapp", hRecipient):                          "sl1:{acme}:inbound:whatsapp:zjPL_0AFlVFIdA3Cf7VuJA",
		def.Once("acme", "reply-stop", "sms", hRecipient):                    "sl1:{acme}:once:reply-stop:sms:zjPL_0AFlVFIdA3Cf7VuJA",
		def.Suppressed("acme", "sms", hRecipient):                            "sl1:{acme}:suppressed:sms:zjPL_0AFlVFIdA3Cf7VuJA",
		sl9.Suppressed("acme", "sms", hRecipient):                            "sl9:{acme}:suppressed:sms:zjPL_0AFlVFIdA3Cf7VuJA",
		def.SuppressedPattern("sms"):                                         "sl1:{*}:suppressed:sms:*",
		def.Migrated(hMigration):                                             "sl1:{sluice}:migrated::S27ZYZOfyhahVZddXfxOEg",
		def.Digest("acme", "email", "news", hDigest):                         "sl1:{acme}:digest:email.news:E47wl81R2ZRwDM2Lcns7GA",
		def.Inflight("acme", "sms:recipient", hRecipient):                    "sl1:{acme}:sms:recipient:inflight:zjPL_0AFlVFIdA3Cf7VuJA",
		sl9.Inflight("~shared", "sms:provider", ""):                          "sl9:{%7Eshared}:sms:provider:inflight",
		def.Hold("sms:provider", ""):                                         "sl1:{hold}:sms:provider",
		def.Hold("sms:sender", hRecipient):                                   "sl1:{hold}:sms:sender:zjPL_0AFlVFIdA3Cf7VuJA",
		sl9.Hold("sms:provider", ""):                                         "sl9:{hold}:sms:provider",
		def.Holds():                                                          "sl1:{hold}:",
		def.Breaker("sms", "backup"):                                         "sl1:{hold}:breaker:sms:backup",
		sl9.Breaker("sms", "backup"):                                         "sl9:{hold}:breaker:sms:backup",
		def.Breakers():                                                       "sl1:{hold}:breakers",
		def.ProviderEvents():                                                 "sl1:{hold}:provider-events",
		sl9.ProviderEvents():                                                 "sl9:{hold}:provider-events",
		due + " " + bytes + " " + total:                                      "sluice:queued:{acme}:due sluice:queued:{acme}:bytes sluice:queued:{acme}:total",
		Idempotency("acme", "O_ixV8Qjju_lrkpm7Kgca4h9Tc7bWN1nQnGFn03C7f0"):   "sluice:api:{acme}:idem:O_ixV8Qjju_lrkpm7Kgca4h9Tc7bWN1nQnGFn03C7f0",
		nlog + " " + nsum:                                                    "sluice:api:{ntok:tok1}:log sluice:api:{ntok:tok1}:sum",
		EndedSession("nj8VYyTULw6ktvT8"):                                     "sluice:{api}:ui:ended:nj8VYyTULw6ktvT8",
		Token("MAC"):                                                         "sluice:{api}:token:MAC",
		Tokens("acme"):                                                       "sluice:{api}:tokens:acme",
		TokensPattern:                                                        "sluice:{api}:tokens:*",
		PlansTenants + " " + PlansVersion + " " + PlansLog:                   "sluice:{plans}:tenants sluice:{plans}:version sluice:{plans}:log",
		PlansChanged:     "sluice:plans:changed",
		Webhooks("acme"): "sluice:{acme}:webhooks",
		WebhookSeen("sendgrid", "e0Cfky0siOl_DBdnbIQg0w"): "sluice:webhook-seen:sendgrid:{e0Cfky0siOl_DBdnbIQg0w}",
		DigestTemplates:                     "sluice:{templates}:digest",
		Holders:                             "sluice:{held}:holders",
		Held("host-1:42:abcd"):              "sluice:{held}:h:host-1:42:abcd",
		QueuesStartingWith("notifications"): "asynq:{notifications",
		QueuesStartingWith("mail"):          "asynq:{mail",
		q.Pending():                         "asynq:{notifications.sms.0}:pending",
		q.Groups():                          "asynq:{notifications.sms.0}:groups",
		q.Fair():                            "asynq:{notifications.sms.0}:fair",
		q.FairClock():                       "asynq:{notifications.sms.0}:fair:clock",
		q.TaskPrefix():                      "asynq:{notifications.sms.0}:t:",
		q.Task("tid-1"):                     "asynq:{notifications.sms.0}:t:tid-1",
		q.GroupPrefix():                     "asynq:{notifications.sms.0}:g:",
		q.Group("acme"):                     "asynq:{notifications.sms.0}:g:acme",
		q.Scheduled():                       "asynq:{notifications.sms.0}:scheduled",
		AsynqQueues:                         "asynq:queues",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

// The keys of a queue that only the hand-built code named (internal/completer,
// internal/fairq, internal/pollgate, internal/orphans, the worker's queue
// metrics): "asynq:{<queue>}:" and the suffix, as Asynq v0.26 names them.
func TestQueueKeys(t *testing.T) {
	t.Parallel()
	q := AsynqQueue("q.1")
	for got, want := range map[string]string{
		q.Active(): "asynq:{q.1}:active", q.Lease(): "asynq:{q.1}:lease", q.Paused(): "asynq:{q.1}:paused",
		q.Retry(): "asynq:{q.1}:retry", q.Archived(): "asynq:{q.1}:archived", q.Completed(): "asynq:{q.1}:completed",
		q.Processed(): "asynq:{q.1}:processed", q.AggregationSets(): "asynq:{q.1}:aggregation_sets",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	if !q.IsProcessedOn("asynq:{q.1}:processed:2026-12-07") || q.IsProcessedOn("asynq:{q.1}:processed") ||
		q.IsProcessedOn("asynq:{q.2}:processed:2026-12-07") {
		t.Error("IsProcessedOn")
	}
	for key, want := range map[string][3]string{
		"asynq:{q.1}:active":        {"q.1", "active", "ok"},
		"asynq:{q.1}:t:abc":         {"q.1", "t:abc", "ok"},
		"asynq:{}:active":           {"", "", ""},
		"asynq:servers":             {"", "", ""},
		"sl1:{acme}:n:1":            {"", "", ""},
		"asynq:{q.1}:fair:clock":    {"q.1", "fair:clock", "ok"},
		"asynq:{notifications.x}:x": {"notifications.x", "x", "ok"},
	} {
		queue, rest, ok := QueueOf(key)
		if ok != (want[2] == "ok") || ok && (queue != want[0] || rest != want[1]) {
			t.Errorf("QueueOf(%q) = %q, %q, %v; want %q", key, queue, rest, ok, want)
		}
	}
	s := Space{Prefix: "sl9"}
	if ch, p, ok := s.BreakerOf(s.Breaker("sms", "backup")); !ok || ch != "sms" || p != "backup" {
		t.Errorf("BreakerOf: %q %q %v", ch, p, ok)
	}
	if _, _, ok := s.BreakerOf(Space{}.Breaker("sms", "backup")); ok || s.IsBreaker(s.Hold("sms:provider", "")) || !s.IsBreaker(s.Breaker("a", "b")) {
		t.Error("a breaker key of another prefix, or a hold, taken for a breaker")
	}
	if tenant, ok := TenantOfTokens(Tokens("acme")); !ok || tenant != "acme" {
		t.Errorf("TenantOfTokens: %q %v", tenant, ok)
	}
}

// Every key a builder makes is in the table, in the row that documents
// it; and keys Sluice never writes are in none.
func TestMatch(t *testing.T) {
	t.Parallel()
	s, q := Space{}, AsynqQueue("notifications.sms.0")
	due, _, total := Queued("acme")
	nlog, _ := NotificationRate("tok1")
	for key, row := range map[string]string{ // key → the first pattern of its row
		s.Window("acme", "sms:recipient", "60000", hRecipient): "sl1:{<tenant>}:<channel>[.<category>]:<scope>:<window>[:<HMAC>]",
		s.Window("acme", "sms.promo:tenant", "60000", ""):      "sl1:{<tenant>}:<channel>[.<category>]:<scope>:<window>[:<HMAC>]",
		s.Window("~shared", "sms:provider", "60000", ""):       "sl1:{%7Eshared}:<channel>:sender\\|provider:<window>[:<HMAC>]",
		s.Window("api/tok1", "api:requests", "60000", ""):      "sl1:{api%2F<token id>}:api:requests:<window>",
		s.Window("authfail/x", "auth:failures", "60000", ""):   "sl1:{api%2F<token id>}:api:requests:<window>",
		s.Inflight("acme", "sms:recipient", hRecipient):        "sl1:{<tenant>}:<scope>:inflight[:<HMAC>]",
		s.Hold("sms:provider", ""):                             "sl1:{hold}:<channel>:provider\\|sender[:<HMAC>]",
		s.Hold("email:sender", hRecipient):                     "sl1:{hold}:<channel>:provider\\|sender[:<HMAC>]",
		s.Breaker("sms", "backup"):                             "sl1:{hold}:breaker:<channel>:<provider>",
		s.Breakers():                                           "sl1:{hold}:breakers",
		s.State("acme", compactID):                             "sl1:{<tenant>}:n:<id>",
		s.Record("acme", compactID, RecordRecipient):           "sl1:{<tenant>}:n:<id>:to",
		s.Record("acme", compactID, RecordDelivery):            "sl1:{<tenant>}:n:<id>:dlv",
		s.Record("acme", compactID, RecordFallback):            "sl1:{<tenant>}:n:<id>:fb",
		s.Record("acme", compactID, RecordProvider):            "sl1:{<tenant>}:n:<id>:prv",
		s.Record("acme", compactID, RecordDigestItems):         "sl1:{<tenant>}:n:<id>:dgi",
		s.Digest("acme", "email", "news", hDigest):             "sl1:{<tenant>}:digest:<channel>.<category>:<HMAC>",
		s.Consent("acme", "sms", hRecipient):                   "sl1:{<tenant>}:consent:<channel>:<HMAC>",
		s.Ledger("acme", "sms", hRecipient):                    "sl1:{<tenant>}:ledger:<channel>:<HMAC>",
		s.Last("acme", "sms", hRecipient):                      "sl1:{<tenant>}:last:<channel>:<HMAC>",
		s.Inbound("acme", "whatsapp", hRecipient):              "sl1:{<tenant>}:inbound:whatsapp:<HMAC>",
		s.Once("acme", "reply-stop", "sms", hRecipient):        "sl1:{<tenant>}:once:<what>:<channel>:<HMAC>",
		s.Suppressed("acme", "sms", hRecipient):                "sl1:{<tenant>}:suppressed:<channel>:<HMAC>",
		s.Migrated(hMigration):                                 "sl1:{sluice}:migrated::<HMAC>",
		Holders:                                                "sluice:{held}:holders",
		Held("host-1:42:abcd"):                                 "sluice:{held}:h:<holder id>",
		DigestTemplates:                                        "sluice:{templates}:digest",
		due:                                                    "sluice:queued:{<tenant>}:due\\|bytes\\|total",
		total:                                                  "sluice:queued:{<tenant>}:due\\|bytes\\|total",
		Idempotency("acme", "x"):                               "sluice:api:{<tenant>}:idem:<SHA-256>",
		nlog:                                                   "sluice:api:{ntok:<token id>}:log\\|sum",
		EndedSession("x"):                                      "sluice:{api}:ui:ended:<hash>",
		Token("x"):                                             "sluice:{api}:token:<HMAC>",
		Tokens("acme"):                                         "sluice:{api}:tokens:<tenant>",
		PlansTenants:                                           "sluice:{plans}:tenants",
		PlansVersion:                                           "sluice:{plans}:version",
		PlansLog:                                               "sluice:{plans}:log",
		Webhooks("acme"):                                       "sluice:{<tenant>}:webhooks",
		WebhookSeen("twilio", "x"):                             "sluice:webhook-seen:<provider>:{<hash>}",
		q.Fair():                                               "asynq:{<queue>}:fair",
		q.FairClock():                                          "asynq:{<queue>}:fair:clock",
		q.Pending():                                            "asynq:{<queue>}:pending\\|active\\|lease\\|paused\\|scheduled\\|retry\\|archived\\|completed\\|groups\\|processed\\|aggregation_sets",
		q.Processed():                                          "asynq:{<queue>}:pending\\|active\\|lease\\|paused\\|scheduled\\|retry\\|archived\\|completed\\|groups\\|processed\\|aggregation_sets",
		q.Task("x"):                                            "asynq:{<queue>}:pending\\|active\\|lease\\|paused\\|scheduled\\|retry\\|archived\\|completed\\|groups\\|processed\\|aggregation_sets",
		q.AggregationSets():                                    "asynq:{<queue>}:pending\\|active\\|lease\\|paused\\|scheduled\\|retry\\|archived\\|completed\\|groups\\|processed\\|aggregation_sets",
		q.Group("acme"):                                        "asynq:{<queue>}:pending\\|active\\|lease\\|paused\\|scheduled\\|retry\\|archived\\|completed\\|groups\\|processed\\|aggregation_sets",
		q.Processed() + ":2026-12-07":                          "asynq:{<queue>}:processed:<yyyy-mm-dd>",
		"asynq:{notifications.sms.0}:unique:x":                 "asynq:{<queue>}:<rest>",
		"asynq:servers":                                        "asynq:{<queue>}:<rest>",
		"asynq:servers:{host:1:x}":                             "asynq:{<queue>}:<rest>",
		"asynq:queues":                                         "asynq:{<queue>}:<rest>",
	} {
		got, ok := Match(key)
		if !ok || got.Keys[0] != row {
			t.Errorf("Match(%q) = %q, %v; want the row of %q", key, got.Keys, ok, row)
		}
	}
	for _, key := range []string{"sl2:{acme}:n:1", "sluice:{api}:other:x", "asynq:cancel", "asynq:servers2", "sluice:plans:changed", "other"} {
		if row, ok := Match(key); ok {
			t.Errorf("Match(%q) = the row of %q, want none", key, row.Keys)
		}
	}
}

// The pattern notation: placeholders, optional parts, alternatives.
func TestPatterns(t *testing.T) {
	t.Parallel()
	r := Row{Keys: []string{"a:{<t>}:x\\|yy[:<h>]"}}
	for key, want := range map[string]bool{
		"a:{t}:x": true, "a:{t}:yy:h": true, "a:{t}:yy": true, "a:{}:x": true,
		"a:{t}:z": false, "a:{t}:xyy": false, "b:{t}:x": false, "a:{t}:x:": true,
	} {
		if got := r.Matches(key); got != want {
			t.Errorf("%q: got %v, want %v", key, got, want)
		}
	}
	for _, row := range table {
		if row.Owner == "" || row.WrittenBy == "" || row.TTL == "" || len(row.Keys) == 0 {
			t.Errorf("row %q lacks a cell", row.Keys)
		}
		if strings.Contains(row.Owner+row.WrittenBy+row.TTL+row.Note, " | ") {
			t.Errorf("row %q: a cell holds \" | \", which ends a cell", row.Keys)
		}
	}
}

// An old suppressed key gives the consent and ledger keys of its tenant
// and recipient, as consent's migration built them.
func TestFromSuppressed(t *testing.T) {
	t.Parallel()
	s := Space{Prefix: "sl9"}
	c, l, ok := FromSuppressed(s.Suppressed("acme", "sms", hRecipient), "sms")
	if !ok || c != s.Consent("acme", "sms", hRecipient) || l != s.Ledger("acme", "sms", hRecipient) {
		t.Errorf("got %q, %q, %v", c, l, ok)
	}
	if _, _, ok := FromSuppressed(s.Suppressed("acme", "email", hRecipient), "sms"); ok {
		t.Error("an email key taken for an SMS one")
	}
}
