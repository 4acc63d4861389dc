// Package config is the one home of the settings every Sluice command
// shares — where Redis is, the queue layout, the rules, the secrets and
// payload keys, logging — and of the machinery that reads them: SLUICE_*
// environment variables with caarlos0/env, validation that names each
// variable, masking for logs, unknown-variable hints, and the generated
// documentation table. Open turns a Base into what every command needs:
// the Redis client, the limiter, the key ring, the logger, the metrics
// registry and the deployment's rules.
//
// A command's own configuration embeds Base and adds its fields
// (worker.Config, api.Config); a sender's settings live in its own package
// (sender/smtp, sender/twilio) and are read with Read.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// Base is what workers, the API and the tools all read. Every field has a
// default (envDefault) and a description (desc) from which the
// configuration table is generated.
type Base struct {
	RedisURL          string        `env:"REDIS_URL" envDefault:"redis://localhost:6379/0" desc:"Redis for queues and quotas: redis://[user:password@]host:port/db, or rediss:// for TLS." secret:"true"`
	RedisClusterAddrs []string      `env:"REDIS_CLUSTER_ADDRS" envSeparator:"," desc:"Comma-separated host:port seeds of a Redis Cluster; when set it is used instead of REDIS_URL's host (REDIS_URL still gives user, password and TLS)."`
	RedisCAFile       string        `env:"REDIS_CA_FILE" desc:"PEM file of CA certificates to trust for rediss:// instead of the system roots (they replace them; append the system bundle to the file to trust both); empty: the system roots. Each server's certificate must name the host it is dialed by (REDIS_URL's host; a Cluster node's announced address). Needs a rediss:// REDIS_URL."`
	Queue             string        `env:"QUEUE" envDefault:"notifications" desc:"Base name of the Asynq queues: each lane is split into QUEUE_SHARDS queues QUEUE.priority.N, QUEUE.standard.N and QUEUE.bulk.N, a tenant's notifications always in the same shard; QUEUE itself (the single queue of earlier releases) is still served. Producers (sluice enqueue, the API) and workers need the same value."`
	QueueShards       int           `env:"QUEUE_SHARDS" envDefault:"8" desc:"Queues per lane (1-64): one tenant's flood delays only the tenants of its shard, and the shards spread over a Redis Cluster's masters. Producers and workers need the same value; a tenant plan's shard=K gives a tenant a shard of its own."`
	Rules             string        `env:"RULES" envDefault:"sms:recipient=1/1m,sms:recipient=5/1d,sms:tenant=1000/1h,email:recipient=10/1m,email:tenant=10000/1h" desc:"The rules, comma- or newline-separated (docs/rules.md); each entry may start with TENANT/. Rates: CHANNEL[.CATEGORY]:SCOPE=LIMIT/WINDOW [drop] with SCOPE recipient, tenant, sender, provider or user (LIMIT/WINDOW@distinct on tenant, sender or provider counts distinct recipients) (*[.CATEGORY]:user=LIMIT/WINDOW counts every channel; CHANNEL[.CATEGORY]:user=required refuses a notification without user); in-flight caps: CHANNEL[.CATEGORY]:SCOPE:concurrency=N. Lanes: CHANNEL.CATEGORY:exempt, CHANNEL[.CATEGORY]:bulk, TENANT/shard=K, TENANT/weight=N (the tenant's fair share of a lane, default 1). Timing: CHANNEL[.CATEGORY]:quiet=HH:MM-HH:MM (sms: quiet=tcpa), :max-defer=DURATION, :rerun=at-least-once|at-most-once; tz=ZONE. Email: email[.CATEGORY]:unsubscribe=TARGET|hosted. Consent: CHANNEL.CATEGORY:consent=exempt, CHANNEL:optout=all|category, sms:reply-stop|start|help=TEXT, sms:keywords-stop|start|help=WORD …; TENANT/sms:inbound=NUMBER|ID… (the numbers and messaging profiles whose inbound messages are the tenant's: others are refused). Queued work: max-queued=N, max-queued-bytes=N. Providers: CHANNEL:providers=A+B (the order of SMS_PROVIDERS or EMAIL_PROVIDERS names to use). Digests: CHANNEL[.CATEGORY]:digest=max:N[+window:D][+key:FIELD] (deferred sends folded into one message per slot). A TENANT/ entry replaces the default of the same target for that tenant."`
	PlanCheckInterval time.Duration `env:"PLAN_CHECK_INTERVAL" envDefault:"1s" desc:"How often a worker checks the version of the tenant plans in Redis (sluice tenant set), besides the pub/sub message each change sends: a change applies within about this long even if the message is lost."`
	DefaultTZ         string        `env:"DEFAULT_TZ" envDefault:"UTC" desc:"IANA time zone for quiet hours of recipients whose zone is unknown (no tz in the notification, no zone from the number, no tenant tz= rule)."`
	SubjectSecret     string        `env:"SUBJECT_SECRET" desc:"Required. Key (≥ 16 bytes) of the HMAC that recipients are stored under in Redis. Changing it restarts every recipient's windows." secret:"true"`
	PayloadKeys       string        `env:"PAYLOAD_KEYS" desc:"Required. Keys that seal notification payloads at rest (AES-256-GCM): ID:BASE64KEY[,ID:BASE64KEY...], 32-byte keys (sluice keygen prints one). The first seals, all open: add a new key first to rotate, drop the old one when no task sealed with it is left. Producers (enqueue, the API) need the same keys." secret:"true"`
	PayloadPlaintext  string        `env:"PAYLOAD_PLAINTEXT" envDefault:"refuse" desc:"refuse: a task whose payload is not sealed is archived unsent; accept: plain JSON payloads are sent too (producers not yet sealing)."`
	CompactMembers    bool          `env:"COMPACT_MEMBERS" envDefault:"true" desc:"Store each notification id in the quota windows as 6 bytes of its SHA-256 (about 20 instead of 54 bytes per entry; a collision within one window has odds of about n²/2⁴⁹). Flipping it on a live system makes ids admitted before the flip look new for one window."`
	DedupeTTL         time.Duration `env:"DEDUPE_TTL" envDefault:"24h" desc:"How long a sent notification's id is remembered, so a re-run task does not send again."`
	SendSlack         time.Duration `env:"SEND_SLACK" envDefault:"100ms" desc:"Every window is widened by this: sends are kept window + slack apart, so a message that reaches the provider up to this long after its slot still keeps every window on the provider's side."`

	RedisAllowEviction bool          `env:"REDIS_ALLOW_EVICTION" envDefault:"false" desc:"Run even where a Redis node's maxmemory-policy is not noeviction (or cannot be read). Without it workers and the API refuse to start, naming the node and the policy: an evicted key is a quota window that forgot its sends, a done record, an idempotency key or a queued task. With it they start with a warning, and /readyz lists it."`
	RedisCheckInterval time.Duration `env:"REDIS_CHECK_INTERVAL" envDefault:"5s" desc:"How often workers and the API read every Redis node's settings and evicted_keys again (CONFIG GET, else INFO; a Cluster's masters and replicas): an eviction, a policy changed at runtime or full memory shows within about this long in the metrics, an error log and /readyz."`
	RedisDegradedFor   time.Duration `env:"REDIS_DEGRADED_FOR" envDefault:"5m" desc:"After Redis evicted keys, how long /readyz answers 503 (degraded), from the last eviction seen; 0: evictions are counted and logged but do not degrade /readyz."`

	SMTPFrom               string `env:"SMTP_FROM" envDefault:"sluice@localhost" desc:"Default From address of emails; what sender rules (email:sender=...) count for an email that names no from."`
	SMSFrom                string `env:"SMS_FROM" desc:"Default From number or sender id of SMS (or set SMS_MESSAGING_SERVICE_SID instead)."`
	WhatsAppFrom           string `env:"WHATSAPP_PHONE_NUMBER_ID" desc:"Default WhatsApp business number of WhatsApp messages: its Cloud API phone-number id (digits); a notification's from names another. Sender rules (whatsapp:sender=...) count by it."`
	SMSMessagingServiceSID string `env:"SMS_MESSAGING_SERVICE_SID" desc:"Default Messaging Service of SMS (MG + 32 hex digits), instead of SMS_FROM: messages are posted with MessagingServiceSid and no From, and the provider picks the number from the service's sender pool. Sender rules (sms:sender=...) count the service as the sender. A notification's own from or messaging_service_sid overrides it."`

	SMSSuppressCodes SuppressCodes `env:"SMS_SUPPRESS_CODES" envDefault:"21211,21610,21614,30005,30006" desc:"Provider error codes that put the recipient on the tenant's SMS suppression list for SMS_SUPPRESS_TTL: a later SMS to it is archived unsent, reason suppressed. The codes come from status callbacks (undelivered, failed) and from the provider's refusal of a send. Default: invalid number, unsubscribed (STOP), not a mobile number, unknown handset, landline or unreachable carrier. none: no suppression list (and no check before each SMS)."`
	SMSSuppressTTL   time.Duration `env:"SMS_SUPPRESS_TTL" envDefault:"720h" desc:"How long a recipient stays on a tenant's SMS suppression list after its last permanent failure (numbers get reassigned)."`

	EmailSuppressTTL time.Duration `env:"EMAIL_SUPPRESS_TTL" envDefault:"720h" desc:"How long an email address stays undeliverable for a tenant after a hard bounce (SMTP 5xx on RCPT, or on DATA saying the mailbox does not exist) or a bounce event; a later email to it is archived unsent, reason suppressed."`
	ConsentRetention time.Duration `env:"CONSENT_RETENTION" envDefault:"43800h" desc:"How long each recipient's consent ledger (every opt-out, opt-in, bounce and reply for review, with its source) is kept: 24h to 20 years, 5 years by default (about 90 bytes of Redis per event)."`
	ConsentMaxEvents int           `env:"CONSENT_MAX_EVENTS" envDefault:"1000" desc:"Most events kept in one recipient's consent ledger (the oldest go first), 1-100000."`
	UnsubscribeURL   string        `env:"UNSUBSCRIBE_URL" desc:"Base URL of sluice api as recipients reach it (e.g. https://sluice.example.com), for the one-click unsubscribe links of email[.CATEGORY]:unsubscribe=hosted rules: /u/TOKEN is added to it. Required when a rule asks for hosted links; workers and the API need the same value."`

	EmailFromDomains FromDomains `env:"EMAIL_FROM_DOMAINS" desc:"The domains each tenant may send email from (the From address, which DKIM signs): TENANT=DOMAIN[|DOMAIN...] entries, comma-separated, with * as TENANT for every tenant not named. Set, a tenant named by no entry (and no *) may use only SMTP_FROM's domain; the API refuses another From (422) and workers archive it unsent (reason invalid). Empty: any domain."`

	TenantMaxQueued      int64         `env:"TENANT_MAX_QUEUED" envDefault:"100000" desc:"Most notifications one tenant may have queued (waiting, scheduled, retrying) at once, counted at enqueue by the API, sluice enqueue and tasks.QueueQuota; past it the API answers 429 (problem queue-full, Retry-After) and nothing of the request is enqueued. About 1.5 KB of Redis each (a small SMS measured 1,435-1,527 B): the default holds ~150 MB per tenant. 0: no cap."`
	TenantMaxQueuedBytes int64         `env:"TENANT_MAX_QUEUED_BYTES" envDefault:"268435456" desc:"Most bytes of queued notifications one tenant may hold in Redis (payload plus 1,600 B per task, measured), counted and refused like TENANT_MAX_QUEUED. Size the sum over tenants within Redis's maxmemory. 0: no cap."`
	TenantQueuedTTL      time.Duration `env:"TENANT_QUEUED_TTL" envDefault:"48h" desc:"Longest a queued notification counts against its tenant's caps (or until its expires_at): the bound on drift if a worker crashed before taking a sent or archived notification out of the count. 1m-720h."`

	LogLevel  string `env:"LOG_LEVEL" envDefault:"info" desc:"debug, info, warn or error."`
	LogFormat string `env:"LOG_FORMAT" envDefault:"text" desc:"text or json."`
}

// Validate records every problem of the shared settings in p, in the
// order of the checks below.
func (b Base) Validate(p *Problems) {
	for _, check := range []func(*Problems){
		b.validateRedis,
		b.validateQueue,
		b.validateRules,
		b.validateSecrets,
		b.validateSends,
		b.validateQueuedCaps,
		b.validateRedisWatch,
		b.validateSMSOrigin,
		b.validateSuppression,
		b.validateUnsubscribe,
		b.validateLogging,
	} {
		check(p)
	}
}

// validateRedis checks where Redis is: REDIS_URL and REDIS_CA_FILE.
func (b Base) validateRedis(p *Problems) {
	if err := checkRedisURL(b.RedisURL); err != nil {
		p.Add("REDIS_URL", "%v", err)
	} else if b.RedisCAFile != "" && !strings.HasPrefix(b.RedisURL, "rediss://") {
		p.Add("REDIS_CA_FILE", "is set but %sREDIS_URL is not a rediss:// URL: the connection would not use TLS", EnvPrefix)
	}
	if b.RedisCAFile != "" {
		if _, err := LoadCAFile(b.RedisCAFile); err != nil {
			p.Add("REDIS_CA_FILE", "%v", err)
		}
	}
}

// validateQueue checks the queue layout: QUEUE and QUEUE_SHARDS.
func (b Base) validateQueue(p *Problems) {
	if b.Queue == "" {
		p.Add("QUEUE", "must not be empty")
	} else if err := b.Layout().Validate(); err != nil {
		if b.QueueShards < 1 || b.QueueShards > tasks.MaxShards {
			p.Add("QUEUE_SHARDS", "must be between 1 and %d, got %d", tasks.MaxShards, b.QueueShards)
		} else {
			p.Add("QUEUE", "%v", err)
		}
	}
}

// validateRules checks the rules and how they are read: RULES,
// PLAN_CHECK_INTERVAL and DEFAULT_TZ.
func (b Base) validateRules(p *Problems) {
	if pol, err := plans.Parse(b.Rules); err != nil {
		p.Add("RULES", "%v", err)
	} else if err := pol.CheckDefaults(); err != nil {
		p.Add("RULES", "%v", err)
	}
	if b.PlanCheckInterval < 10*time.Millisecond {
		p.Add("PLAN_CHECK_INTERVAL", "must be at least 10ms, got %v", b.PlanCheckInterval)
	}
	if _, err := plans.Zones(b.DefaultTZ, "", nil); err != nil {
		p.Add("DEFAULT_TZ", "%v", err)
	}
}

// validateSecrets checks the keys: SUBJECT_SECRET, PAYLOAD_KEYS and
// PAYLOAD_PLAINTEXT.
func (b Base) validateSecrets(p *Problems) {
	if len(b.SubjectSecret) < 16 {
		p.Add("SUBJECT_SECRET", "must be set to at least 16 bytes (e.g. `openssl rand -hex 32`)")
	}
	if _, err := tasks.ParseKeyring(b.PayloadKeys); err != nil {
		p.Add("PAYLOAD_KEYS", "%v", err)
	}
	if b.PayloadPlaintext != "refuse" && b.PayloadPlaintext != "accept" {
		p.Add("PAYLOAD_PLAINTEXT", "must be refuse or accept, got %q", b.PayloadPlaintext)
	}
}

// validateSends checks how sends are made: DEDUPE_TTL, SEND_SLACK and
// EMAIL_FROM_DOMAINS.
func (b Base) validateSends(p *Problems) {
	if b.DedupeTTL < time.Minute {
		p.Add("DEDUPE_TTL", "must be at least 1m, got %v", b.DedupeTTL)
	}
	if b.SendSlack < 0 || b.SendSlack > time.Minute {
		p.Add("SEND_SLACK", "must be between 0 and 1m, got %v", b.SendSlack)
	}
}

// validateQueuedCaps checks the caps on a tenant's queued work:
// TENANT_MAX_QUEUED, TENANT_MAX_QUEUED_BYTES and TENANT_QUEUED_TTL.
func (b Base) validateQueuedCaps(p *Problems) {
	if b.TenantMaxQueued < 0 {
		p.Add("TENANT_MAX_QUEUED", "must be 0 (no cap) or more, got %d", b.TenantMaxQueued)
	}
	if b.TenantMaxQueuedBytes < 0 {
		p.Add("TENANT_MAX_QUEUED_BYTES", "must be 0 (no cap) or more, got %d", b.TenantMaxQueuedBytes)
	}
	if b.TenantQueuedTTL < time.Minute || b.TenantQueuedTTL > 720*time.Hour {
		p.Add("TENANT_QUEUED_TTL", "must be between 1m and 720h, got %v", b.TenantQueuedTTL)
	}
}

// validateRedisWatch checks how Redis's settings are watched:
// REDIS_CHECK_INTERVAL and REDIS_DEGRADED_FOR.
func (b Base) validateRedisWatch(p *Problems) {
	if b.RedisCheckInterval < 100*time.Millisecond || b.RedisCheckInterval > 10*time.Minute {
		p.Add("REDIS_CHECK_INTERVAL", "must be between 100ms and 10m, got %v", b.RedisCheckInterval)
	}
	if b.RedisDegradedFor < 0 || b.RedisDegradedFor > 24*time.Hour {
		p.Add("REDIS_DEGRADED_FOR", "must be between 0 (never) and 24h, got %v", b.RedisDegradedFor)
	}
}

// validateSMSOrigin checks the default origin of SMS:
// SMS_MESSAGING_SERVICE_SID beside SMS_FROM.
func (b Base) validateSMSOrigin(p *Problems) {
	if b.SMSMessagingServiceSID != "" {
		if !tasks.IsMessagingServiceSID(b.SMSMessagingServiceSID) {
			p.Add("SMS_MESSAGING_SERVICE_SID", "must be MG followed by 32 hex digits (a Twilio Messaging Service SID), got %q", b.SMSMessagingServiceSID)
		}
		if b.SMSFrom != "" {
			p.Add("SMS_MESSAGING_SERVICE_SID", "and %sSMS_FROM are both set: set one, the default origin of messages that name none", EnvPrefix)
		}
	}
}

// validateSuppression checks suppressions and consent: SMS_SUPPRESS_CODES,
// SMS_SUPPRESS_TTL, EMAIL_SUPPRESS_TTL, CONSENT_RETENTION and
// CONSENT_MAX_EVENTS.
func (b Base) validateSuppression(p *Problems) {
	if b.SMSSuppressTTL < time.Hour || b.SMSSuppressTTL > 3650*24*time.Hour {
		p.Add("SMS_SUPPRESS_TTL", "must be between 1h and 87600h (10 years), got %v", b.SMSSuppressTTL)
	}
	if b.EmailSuppressTTL < time.Hour || b.EmailSuppressTTL > 3650*24*time.Hour {
		p.Add("EMAIL_SUPPRESS_TTL", "must be between 1h and 87600h (10 years), got %v", b.EmailSuppressTTL)
	}
	if err := b.ConsentOptions().Validate(); err != nil {
		p.Add("CONSENT_RETENTION", "%v (with CONSENT_MAX_EVENTS)", err)
	}
}

// validateUnsubscribe checks UNSUBSCRIBE_URL, which hosted unsubscribe
// rules need.
func (b Base) validateUnsubscribe(p *Problems) {
	if b.UnsubscribeURL != "" {
		if err := checkBaseURL(b.UnsubscribeURL); err != nil {
			p.Add("UNSUBSCRIBE_URL", "%v", err)
		} else if !strings.HasPrefix(b.UnsubscribeURL, "https://") {
			p.Add("UNSUBSCRIBE_URL", "must be https: mailbox providers make one-click unsubscribe POSTs to https links only (RFC 8058), got %q", b.UnsubscribeURL)
		}
	} else if pol, err := plans.Parse(b.Rules); err == nil && pol.UsesHostedUnsubscribe() {
		p.Add("UNSUBSCRIBE_URL", "must be set: a rule asks for hosted one-click unsubscribe links (unsubscribe=hosted)")
	}
}

// validateLogging checks LOG_LEVEL and LOG_FORMAT.
func (b Base) validateLogging(p *Problems) {
	switch strings.ToLower(b.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		p.Add("LOG_LEVEL", "must be debug, info, warn or error, got %q", b.LogLevel)
	}
	if b.LogFormat != "text" && b.LogFormat != "json" {
		p.Add("LOG_FORMAT", "must be text or json, got %q", b.LogFormat)
	}
}

// Layout is the queue layout of SLUICE_QUEUE and SLUICE_QUEUE_SHARDS.
func (b Base) Layout() tasks.Layout { return tasks.Layout{Base: b.Queue, Shards: b.QueueShards} }

// Origin is who sender rules (CHANNEL:sender=...) count as sending n: its
// own messaging service or from, else the deployment's default (an SMS's
// Messaging Service before its From number: the provider picks the number
// from the service's pool, so the pool is the sender Sluice can know).
func (b Base) Origin(n tasks.Notification) string {
	if n.Channel == tasks.SMS {
		_, v := tasks.SMSOrigin(n, b.SMSFrom, b.SMSMessagingServiceSID)
		return v
	}
	if n.From != "" {
		return n.From
	}
	if n.Channel == tasks.WhatsApp {
		return b.WhatsAppFrom
	}
	return b.SMTPFrom
}

// SuppressCodes are the provider error codes of SMS_SUPPRESS_CODES, parsed
// when the settings are read; nil when it is none (no suppression list, and
// no check before each SMS).
type SuppressCodes map[int]bool

// UnmarshalText reads SMS_SUPPRESS_CODES: comma-separated codes, or none.
func (c *SuppressCodes) UnmarshalText(b []byte) error {
	s := string(b)
	if strings.TrimSpace(s) == "none" {
		*c = nil
		return nil
	}
	out := SuppressCodes{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 999999 || len(f) > 6 {
			return fmt.Errorf("must be comma-separated provider error codes (1 to 6 digits, e.g. 21211,30005) or none, got %q", f)
		}
		out[n] = true
	}
	*c = out
	return nil
}

// String writes the codes as SMS_SUPPRESS_CODES takes them.
func (c SuppressCodes) String() string {
	if c == nil {
		return "none"
	}
	codes := make([]int, 0, len(c))
	for n := range c {
		codes = append(codes, n)
	}
	slices.Sort(codes)
	parts := make([]string, len(codes))
	for i, n := range codes {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

// DefaultZone is SLUICE_DEFAULT_TZ as a location (UTC if it does not load).
func (b Base) DefaultZone() *time.Location {
	if zs, err := plans.Zones(b.DefaultTZ, "", nil); err == nil {
		return zs[0]
	}
	return time.UTC
}

// Planner is how every reader works out a notification's rules, quiet
// spans and deadline under these settings (plans.Planner).
func (b Base) Planner() plans.Planner {
	return plans.Planner{DefaultZone: b.DefaultZone(), SendSlack: b.SendSlack}
}

// NewRedisClient builds the Redis client of b: a Cluster client when
// RedisClusterAddrs is set, else a single-node client from RedisURL. A
// rediss:// URL turns TLS on, verified against RedisCAFile when set (else the
// system roots).
func (b Base) NewRedisClient() (redis.UniversalClient, error) {
	opt, err := redis.ParseURL(b.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %sREDIS_URL: %w", ErrConfig, EnvPrefix, err)
	}
	if b.RedisCAFile != "" {
		if opt.TLSConfig == nil {
			return nil, fmt.Errorf("%w: %sREDIS_CA_FILE is set but %sREDIS_URL is not a rediss:// URL", ErrConfig, EnvPrefix, EnvPrefix)
		}
		if opt.TLSConfig.RootCAs, err = LoadCAFile(b.RedisCAFile); err != nil {
			return nil, fmt.Errorf("%w: %sREDIS_CA_FILE %w", ErrConfig, EnvPrefix, err)
		}
	}
	// ParseURL set ServerName to the URL's host: right for a single node.
	if len(b.RedisClusterAddrs) == 0 {
		return redis.NewClient(opt), nil
	}
	var tlsCfg *tls.Config
	if opt.TLSConfig != nil {
		// A Cluster's nodes are dialed at the addresses they announce, not at
		// the URL's host. With ServerName empty, crypto/tls takes it from the
		// address each dial goes to, so every node's certificate is checked
		// against its own host.
		tlsCfg = opt.TLSConfig.Clone()
		tlsCfg.ServerName = ""
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: b.RedisClusterAddrs, Username: opt.Username, Password: opt.Password, TLSConfig: tlsCfg,
	}), nil
}

// NewLogger returns the slog logger b asks for, writing to out.
func (b Base) NewLogger(out io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(b.LogLevel))
	o := &slog.HandlerOptions{Level: lvl}
	if b.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(out, o))
	}
	return slog.New(slog.NewTextHandler(out, o))
}

// checkRedisURL says what is wrong with a Redis URL: the scheme, the port,
// the database number — not just that it does not parse.
func checkRedisURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("is not a URL (%v); want redis://[user:password@]host:port/db", err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return fmt.Errorf("has scheme %q; want redis:// or rediss://", u.Scheme)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("has port %q; want a number 1–65535", p)
		}
	}
	if _, err := redis.ParseURL(raw); err != nil {
		return err
	}
	return nil
}

// LoadCAFile reads a PEM bundle of CA certificates (SLUICE_*_CA_FILE); it
// fails unless the file is readable and holds at least one certificate.
func LoadCAFile(path string) (*x509.CertPool, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("must name a readable PEM file of CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, fmt.Errorf("must name a PEM file of CA certificates: %s holds no PEM certificate", path)
	}
	return pool, nil
}

// FromDomains are the From domains tenants may send email from
// (EMAIL_FROM_DOMAINS), parsed when the settings are read; nil: any.
type FromDomains map[string][]string

// UnmarshalText reads EMAIL_FROM_DOMAINS (ParseFromDomains).
func (d *FromDomains) UnmarshalText(b []byte) error {
	v, err := ParseFromDomains(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// String writes the entries as EMAIL_FROM_DOMAINS takes them, tenants in order.
func (d FromDomains) String() string {
	tenants := make([]string, 0, len(d))
	for t := range d {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	parts := make([]string, len(tenants))
	for i, t := range tenants {
		parts[i] = t + "=" + strings.Join(d[t], "|")
	}
	return strings.Join(parts, ",")
}

// ParseFromDomains reads EMAIL_FROM_DOMAINS: TENANT=DOMAIN[|DOMAIN...],...
func ParseFromDomains(s string) (FromDomains, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := FromDomains{}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		tenant, doms, ok := strings.Cut(entry, "=")
		tenant = strings.TrimSpace(tenant)
		if !ok || tenant == "" {
			return nil, fmt.Errorf("entry %q: want TENANT=DOMAIN[|DOMAIN...]", entry)
		}
		if tenant != "*" {
			if err := tasks.CheckTenant(tenant); err != nil {
				return nil, fmt.Errorf("entry %q: %w", entry, err)
			}
		}
		if _, dup := out[tenant]; dup {
			return nil, fmt.Errorf("tenant %s is named twice", tenant)
		}
		for _, d := range strings.Split(doms, "|") {
			d = strings.ToLower(strings.TrimSpace(d))
			if d == "" || strings.ContainsAny(d, "@ /") || !strings.Contains(d, ".") {
				return nil, fmt.Errorf("entry %q: %q is not a domain", entry, d)
			}
			out[tenant] = append(out[tenant], d)
		}
	}
	return out, nil
}

// Allows reports whether tenant may send from the address from; def is
// SMTP_FROM, whose domain a tenant named by no entry may use.
func (f FromDomains) Allows(tenant, from, def string) bool {
	if f == nil {
		return true
	}
	domain := func(a string) string {
		if i := strings.LastIndexByte(a, '@'); i >= 0 {
			return strings.ToLower(strings.TrimRight(a[i+1:], ">"))
		}
		return ""
	}
	doms, ok := f[tenant]
	if !ok {
		doms, ok = f["*"]
	}
	if !ok {
		doms = []string{domain(def)}
	}
	d := domain(from)
	for _, want := range doms {
		if d == want {
			return true
		}
	}
	return false
}

// QueuedCaps are the per-tenant caps on queued work of b.
func (b Base) QueuedCaps() tasks.Caps {
	return tasks.Caps{Notifications: b.TenantMaxQueued, Bytes: b.TenantMaxQueuedBytes, TTL: b.TenantQueuedTTL}
}

// ConsentOptions are the consent store's options of b.
func (b Base) ConsentOptions() consent.Options {
	return consent.Options{Retention: b.ConsentRetention, MaxEvents: b.ConsentMaxEvents}
}

// checkBaseURL says what is wrong with a base URL of sluice api.
func checkBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("must be an http(s) URL like https://sluice.example.com, got %q", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(raw, "?") || strings.HasSuffix(raw, "#") {
		return fmt.Errorf("must be a base URL without user info, query or fragment, got %q", raw)
	}
	return nil
}
