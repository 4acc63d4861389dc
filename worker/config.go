package worker

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/mail"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// EnvPrefix starts every environment variable Sluice reads.
const EnvPrefix = "SLUICE_"

// ErrConfig reports a configuration that cannot run; the message names the variable.
var ErrConfig = errors.New("config")

// Config is the worker's configuration, read from SLUICE_* environment
// variables. Every field has a default (envDefault) and a description
// (desc), from which the README's table is generated.
type Config struct {
	RedisURL            string        `env:"REDIS_URL" envDefault:"redis://localhost:6379/0" desc:"Redis for queues and quotas: redis://[user:password@]host:port/db, or rediss:// for TLS." secret:"true"`
	RedisClusterAddrs   []string      `env:"REDIS_CLUSTER_ADDRS" envSeparator:"," desc:"Comma-separated host:port seeds of a Redis Cluster; when set it is used instead of REDIS_URL's host (REDIS_URL still gives user, password and TLS)."`
	RedisCAFile         string        `env:"REDIS_CA_FILE" desc:"PEM file of CA certificates to trust for rediss:// instead of the system roots (they replace them; append the system bundle to the file to trust both); empty: the system roots. Each server's certificate must name the host it is dialed by (REDIS_URL's host; a Cluster node's announced address). Needs a rediss:// REDIS_URL."`
	Queue               string        `env:"QUEUE" envDefault:"notifications" desc:"Base name of the Asynq queues: each lane is split into QUEUE_SHARDS queues QUEUE.priority.N, QUEUE.standard.N and QUEUE.bulk.N, a tenant's notifications always in the same shard; QUEUE itself (the single queue of earlier releases) is still served. Producers (sluice enqueue, the API) and workers need the same value."`
	QueueShards         int           `env:"QUEUE_SHARDS" envDefault:"8" desc:"Queues per lane (1-64): one tenant's flood delays only the tenants of its shard, and the shards spread over a Redis Cluster's masters. Producers and workers need the same value; a tenant plan's shard=K gives a tenant a shard of its own."`
	Concurrency         int           `env:"CONCURRENCY" envDefault:"10" desc:"Standard and bulk tasks processed at once per worker."`
	PriorityConcurrency int           `env:"PRIORITY_CONCURRENCY" envDefault:"4" desc:"Priority-lane tasks (exempt categories: OTPs, fraud alerts) processed at once per worker, on their own dequeuer and slots, so nothing in the standard or bulk lanes is ever ahead of them."`
	BulkWeight          int           `env:"BULK_WEIGHT" envDefault:"1" desc:"Weight (1-16) of each bulk shard in the dequeuer it shares with the standard lane, against 4 for each standard shard: with work waiting in both, bulk gets about WEIGHT/(4+WEIGHT) of the picks (1: a fifth), so it never starves standard nor is starved."`
	QueueRecheck        time.Duration `env:"QUEUE_RECHECK" envDefault:"10s" desc:"An idle worker does not poll queues Redis reported unchanged (client-side-caching invalidations, CLIENT TRACKING); it polls each anyway after this long. 0 turns that off: every queue is polled every POLL_INTERVAL and DELAYED_CHECK_INTERVAL, as plain Asynq does."`
	Rules               string        `env:"RULES" envDefault:"sms:recipient=1/1m,sms:recipient=5/1d,sms:tenant=1000/1h,email:recipient=10/1m,email:tenant=10000/1h" desc:"The rules, comma- or newline-separated (see Rules below): [TENANT/]CHANNEL[.CATEGORY]:SCOPE=LIMIT/WINDOW [drop] with SCOPE recipient, tenant, sender or provider; CHANNEL.CATEGORY:exempt; CHANNEL[.CATEGORY]:quiet=HH:MM-HH:MM, :max-defer=DURATION, :rerun=at-least-once|at-most-once; [TENANT/]tz=ZONE. A TENANT/ entry replaces the default of the same target for that tenant."`
	PlanCheckInterval   time.Duration `env:"PLAN_CHECK_INTERVAL" envDefault:"1s" desc:"How often a worker checks the version of the tenant plans in Redis (sluice tenant set), besides the pub/sub message each change sends: a change applies within about this long even if the message is lost."`
	DefaultTZ           string        `env:"DEFAULT_TZ" envDefault:"UTC" desc:"IANA time zone for quiet hours of recipients whose zone is unknown (no tz in the notification, no zone from the number, no tenant tz= rule)."`
	SubjectSecret       string        `env:"SUBJECT_SECRET" desc:"Required. Key (≥ 16 bytes) of the HMAC that recipients are stored under in Redis. Changing it restarts every recipient's windows." secret:"true"`
	PayloadKeys         string        `env:"PAYLOAD_KEYS" desc:"Required. Keys that seal notification payloads at rest (AES-256-GCM): ID:BASE64KEY[,ID:BASE64KEY...], 32-byte keys (sluice keygen prints one). The first seals, all open: add a new key first to rotate, drop the old one when no task sealed with it is left. Producers (enqueue, the API) need the same keys." secret:"true"`
	PayloadPlaintext    string        `env:"PAYLOAD_PLAINTEXT" envDefault:"refuse" desc:"refuse: a task whose payload is not sealed is archived unsent; accept: plain JSON payloads are sent too (producers not yet sealing)."`
	CompactMembers      bool          `env:"COMPACT_MEMBERS" envDefault:"true" desc:"Store each notification id in the quota windows as 6 bytes of its SHA-256 (about 20 instead of 54 bytes per entry; a collision within one window has odds of about n²/2⁴⁹). Flipping it on a live system makes ids admitted before the flip look new for one window."`
	DedupeTTL           time.Duration `env:"DEDUPE_TTL" envDefault:"24h" desc:"How long a sent notification's id is remembered, so a re-run task does not send again."`

	RedisAllowEviction bool          `env:"REDIS_ALLOW_EVICTION" envDefault:"false" desc:"Run even where a Redis node's maxmemory-policy is not noeviction (or cannot be read). Without it workers and the API refuse to start, naming the node and the policy: an evicted key is a quota window that forgot its sends, a done record, an idempotency key or a queued task. With it they start with a warning, and /readyz lists it."`
	RedisCheckInterval time.Duration `env:"REDIS_CHECK_INTERVAL" envDefault:"5s" desc:"How often workers and the API read every Redis node's settings and evicted_keys again (CONFIG GET, else INFO; a Cluster's masters and replicas): an eviction, a policy changed at runtime or full memory shows within about this long in the metrics, an error log and /readyz."`
	RedisDegradedFor   time.Duration `env:"REDIS_DEGRADED_FOR" envDefault:"5m" desc:"After Redis evicted keys, how long /readyz answers 503 (degraded), from the last eviction seen; 0: evictions are counted and logged but do not degrade /readyz."`
	RedisWaitReplicas  int           `env:"REDIS_WAIT_REPLICAS" envDefault:"0" desc:"Replicas that must acknowledge each admission (Redis WAIT, right after the quota check on the same connection; on a Cluster to the master of the tenant's slot) before the send goes out, so a failover cannot lose an admission a send went out on. Fewer within REDIS_WAIT_TIMEOUT: nothing is sent and the task tries again, as when Redis is unreachable. 0: no wait (Redis replicates asynchronously)."`
	RedisWaitTimeout   time.Duration `env:"REDIS_WAIT_TIMEOUT" envDefault:"500ms" desc:"How long an admission waits for REDIS_WAIT_REPLICAS acknowledgements (1ms to 2s)."`

	EmailSender        string        `env:"EMAIL_SENDER" envDefault:"log" desc:"Email sender: smtp, or log (writes to the log, sends nothing)."`
	SMTPHost           string        `env:"SMTP_HOST" envDefault:"localhost" desc:"SMTP server host."`
	SMTPPort           int           `env:"SMTP_PORT" envDefault:"587" desc:"SMTP server port."`
	SMTPTLS            string        `env:"SMTP_TLS" envDefault:"starttls" desc:"SMTP transport security: starttls (required), opportunistic, tls (implicit, port 465), none."`
	SMTPCAFile         string        `env:"SMTP_CA_FILE" desc:"PEM file of CA certificates to trust for the SMTP server instead of the system roots (they replace them; append the system bundle to the file to trust both); empty: the system roots. The certificate must name SMTP_HOST. Not allowed with SMTP_TLS=none."`
	SMTPUser           string        `env:"SMTP_USERNAME" desc:"SMTP AUTH user; empty disables AUTH. Needs SMTP_TLS starttls or tls unless SMTP_ALLOW_PLAIN_AUTH=true."`
	SMTPPass           string        `env:"SMTP_PASSWORD" desc:"SMTP AUTH password." secret:"true"`
	SMTPAllowPlainAuth bool          `env:"SMTP_ALLOW_PLAIN_AUTH" envDefault:"false" desc:"Allow SMTP AUTH with SMTP_TLS none or opportunistic, where the password (PLAIN or LOGIN) may cross the network unencrypted; without it such a configuration is refused."`
	SMTPFrom           string        `env:"SMTP_FROM" envDefault:"sluice@localhost" desc:"Default From address of emails."`
	SMTPConns          int           `env:"SMTP_CONNECTIONS" envDefault:"4" desc:"SMTP connections kept open and reused per worker."`
	SMTPTimeout        time.Duration `env:"SMTP_TIMEOUT" envDefault:"15s" desc:"Timeout of one SMTP dial or send."`

	DKIMDomain   string   `env:"DKIM_DOMAIN" desc:"DKIM signing domain (d=); with DKIM_SELECTOR and DKIM_KEY_FILE (all three or none) the smtp sender signs every email. For DMARC it should be the From domain (SMTP_FROM's and any per-notification from) or a parent of it."`
	DKIMSelector string   `env:"DKIM_SELECTOR" desc:"DKIM selector (s=): receivers fetch the public key from the TXT record SELECTOR._domainkey.DKIM_DOMAIN."`
	DKIMKeyFile  string   `env:"DKIM_KEY_FILE" desc:"PEM file of the DKIM private key: RSA (PKCS #1 or #8, at least 1024 bits, 2048 recommended) or Ed25519 (PKCS #8), unencrypted."`
	DKIMHeaders  []string `env:"DKIM_HEADERS" envSeparator:"," envDefault:"From,To,Subject,Date,Message-ID,MIME-Version,Content-Type,Reply-To,List-Unsubscribe,List-Unsubscribe-Post" desc:"Comma-separated header fields the DKIM signature covers (h=); must include From. A listed field a message lacks is signed as absent, so a relay cannot add it."`

	SMSSender     string        `env:"SMS_SENDER" envDefault:"log" desc:"SMS sender: http (Twilio-compatible Messages API), or log."`
	SMSBaseURL    string        `env:"SMS_BASE_URL" envDefault:"https://api.twilio.com" desc:"Base URL of the Twilio-compatible API; messages are POSTed to BASE/2010-04-01/Accounts/SID/Messages.json."`
	SMSAccountSID string        `env:"SMS_ACCOUNT_SID" desc:"Account SID (basic-auth user)."`
	SMSAuthToken  string        `env:"SMS_AUTH_TOKEN" desc:"Auth token (basic-auth password); the API checks the X-Twilio-Signature of status callbacks with it." secret:"true"`
	SMSFrom       string        `env:"SMS_FROM" desc:"Default From number or sender id of SMS (or set SMS_MESSAGING_SERVICE_SID instead)."`
	SMSTimeout    time.Duration `env:"SMS_TIMEOUT" envDefault:"10s" desc:"Timeout of one SMS API request."`

	SMSMessagingServiceSID string        `env:"SMS_MESSAGING_SERVICE_SID" desc:"Default Messaging Service of SMS (MG + 32 hex digits), instead of SMS_FROM: messages are posted with MessagingServiceSid and no From, and the provider picks the number from the service's sender pool. Sender rules (sms:sender=...) count the service as the sender. A notification's own from or messaging_service_sid overrides it."`
	SMSStatusCallbackURL   string        `env:"SMS_STATUS_CALLBACK_URL" desc:"Base URL of sluice api as the SMS provider reaches it (e.g. https://sluice.example.com). When set, each SMS asks for status callbacks at BASE/v1/callbacks/sms/TENANT/ID; the API checks their X-Twilio-Signature with SMS_AUTH_TOKEN and reports delivered, undelivered or failed. A path in it is one a proxy strips before the API. Workers and the API need the same value."`
	SMSSuppressCodes       string        `env:"SMS_SUPPRESS_CODES" envDefault:"21211,21610,21614,30005,30006" desc:"Provider error codes that put the recipient on the tenant's SMS suppression list for SMS_SUPPRESS_TTL: a later SMS to it is archived unsent, reason suppressed. The codes come from status callbacks (undelivered, failed) and from the provider's refusal of a send. Default: invalid number, unsubscribed (STOP), not a mobile number, unknown handset, landline or unreachable carrier. none: no suppression list (and no check before each SMS)."`
	SMSSuppressTTL         time.Duration `env:"SMS_SUPPRESS_TTL" envDefault:"720h" desc:"How long a recipient stays on a tenant's SMS suppression list after its last permanent failure (numbers get reassigned)."`

	HTTPAddr             string        `env:"HTTP_ADDR" envDefault:":9090" desc:"Listen address of /metrics, /healthz and /readyz; off disables it."`
	ShutdownTimeout      time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s" desc:"On SIGTERM, how long in-flight sends may finish before their tasks are handed back to the queue."`
	Reschedule           string        `env:"RESCHEDULE" envDefault:"booked" desc:"How a task whose slot lies ahead waits: booked (the limiter books the slot; about 2 checks per send in a backlog) or naive (it is woken when the slot opens and competes for it)."`
	SendSlack            time.Duration `env:"SEND_SLACK" envDefault:"100ms" desc:"Every window is widened by this: sends are kept window + slack apart, so a message that reaches the provider up to this long after its slot still keeps every window on the provider's side."`
	MaxInlineWait        time.Duration `env:"MAX_INLINE_WAIT" envDefault:"2s" desc:"A slot at most this far ahead is waited for inside the worker (to the millisecond) instead of through Asynq's whole-second scheduler; booked tasks are woken early by up to a second plus DELAYED_CHECK_INTERVAL + POLL_INTERVAL + 100ms and wait the rest here, so keep it above that."`
	MaxWaiters           int           `env:"MAX_WAITERS" envDefault:"32" desc:"Tasks that may wait in process for their slot at once, on top of CONCURRENCY (Asynq runs CONCURRENCY + MAX_WAITERS tasks, so waiting never blocks sending)."`
	Rerun                string        `env:"RERUN" envDefault:"at-least-once" desc:"A task that runs again after an attempt whose outcome is unknown (admitted, neither recorded as sent nor released: a crash mid-send): at-least-once sends again and counts the re-send as a fresh message in every window; at-most-once archives it (reason outcome_unknown)."`
	DelayedCheckInterval time.Duration `env:"DELAYED_CHECK_INTERVAL" envDefault:"250ms" desc:"How often due rescheduled tasks are moved to the queue (Asynq's DelayedTaskCheckInterval); bounds how late a throttled task wakes."`
	PollInterval         time.Duration `env:"POLL_INTERVAL" envDefault:"100ms" desc:"How often an idle worker polls for tasks (Asynq's TaskCheckInterval)."`
	RetryBase            time.Duration `env:"RETRY_BASE" envDefault:"2s" desc:"First backoff of a failed send; doubles per retry."`
	RetryMax             time.Duration `env:"RETRY_MAX" envDefault:"10m" desc:"Longest backoff of a failed send."`
	OrphanAfter          time.Duration `env:"ORPHAN_AFTER" envDefault:"15s" desc:"A task Asynq holds as active whose lease has not been extended for this long (while Redis answered) and that no live worker lists is put back at the head of the queue: a worker killed mid-task, or a dequeue whose reply Redis lost as it died. Asynq's own recovery takes 60-120 s. At least 11s (two of Asynq's 5 s heartbeats and a margin); 0 leaves it to Asynq."`
	UnavailableRetry     time.Duration `env:"UNAVAILABLE_RETRY" envDefault:"2s" desc:"When Redis cannot be asked for a quota, how long until the task is tried again (nothing is sent meanwhile)."`
	LogLevel             string        `env:"LOG_LEVEL" envDefault:"info" desc:"debug, info, warn or error."`
	LogFormat            string        `env:"LOG_FORMAT" envDefault:"text" desc:"text or json."`
}

// LoadConfig reads the configuration from the environment (SLUICE_*) and validates it.
func LoadConfig() (Config, error) {
	return ParseConfig(nil)
}

// ParseConfig reads the configuration from environ (KEY=VALUE pairs, nil for
// the process environment) and validates it.
func ParseConfig(environ map[string]string) (Config, error) {
	cfg, err := ReadConfig(environ)
	if err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

// ReadConfig reads the configuration like ParseConfig but checks only that
// every value parses: for tools that need a few fields (enqueue needs Redis
// and the queue, not an SMTP server).
func ReadConfig(environ map[string]string) (Config, error) {
	opts := env.Options{Prefix: EnvPrefix}
	if environ != nil {
		opts.Environment = environ
	}
	cfg, err := env.ParseAsWithOptions[Config](opts)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return cfg, nil
}

// Validate checks every field; the error names the variable and the bound.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s%s %s", ErrConfig, EnvPrefix, name, fmt.Sprintf(format, args...)))
	}
	if err := checkRedisURL(c.RedisURL); err != nil {
		bad("REDIS_URL", "%v", err)
	} else if c.RedisCAFile != "" && !strings.HasPrefix(c.RedisURL, "rediss://") {
		bad("REDIS_CA_FILE", "is set but %sREDIS_URL is not a rediss:// URL: the connection would not use TLS", EnvPrefix)
	}
	if c.RedisCAFile != "" {
		if _, err := loadCAFile(c.RedisCAFile); err != nil {
			bad("REDIS_CA_FILE", "%v", err)
		}
	}
	if err := c.Layout().Validate(); err != nil {
		if c.QueueShards < 1 || c.QueueShards > tasks.MaxShards {
			bad("QUEUE_SHARDS", "must be between 1 and %d, got %d", tasks.MaxShards, c.QueueShards)
		} else {
			bad("QUEUE", "%v", err)
		}
	}
	if c.RedisCheckInterval < 100*time.Millisecond || c.RedisCheckInterval > 10*time.Minute {
		bad("REDIS_CHECK_INTERVAL", "must be between 100ms and 10m, got %v", c.RedisCheckInterval)
	}
	if c.RedisDegradedFor < 0 || c.RedisDegradedFor > 24*time.Hour {
		bad("REDIS_DEGRADED_FOR", "must be between 0 (never) and 24h, got %v", c.RedisDegradedFor)
	}
	if c.RedisWaitReplicas < 0 || c.RedisWaitReplicas > 16 {
		bad("REDIS_WAIT_REPLICAS", "must be between 0 (no wait) and 16, got %d", c.RedisWaitReplicas)
	}
	if c.RedisWaitTimeout < time.Millisecond || c.RedisWaitTimeout > 2*time.Second {
		bad("REDIS_WAIT_TIMEOUT", "must be between 1ms and 2s (below the Redis client's 5 s read timeout), got %v", c.RedisWaitTimeout)
	}
	if c.Queue == "" {
		bad("QUEUE", "must not be empty")
	}
	if c.PriorityConcurrency < 1 || c.PriorityConcurrency > 10_000 {
		bad("PRIORITY_CONCURRENCY", "must be between 1 and 10000, got %d", c.PriorityConcurrency)
	}
	if c.BulkWeight < 1 || c.BulkWeight > 16 {
		bad("BULK_WEIGHT", "must be between 1 and 16, got %d", c.BulkWeight)
	}
	if c.QueueRecheck != 0 && (c.QueueRecheck < time.Second || c.QueueRecheck > 10*time.Minute) {
		bad("QUEUE_RECHECK", "must be 0 (off) or between 1s and 10m, got %v", c.QueueRecheck)
	}
	if c.Concurrency < 1 || c.Concurrency > 10_000 {
		bad("CONCURRENCY", "must be between 1 and 10000, got %d", c.Concurrency)
	}
	if p, err := plans.Parse(c.Rules); err != nil {
		bad("RULES", "%v", err)
	} else if err := p.CheckDefaults(); err != nil {
		bad("RULES", "%v", err)
	}
	if _, err := plans.Zones(c.DefaultTZ, "", nil); err != nil {
		bad("DEFAULT_TZ", "%v", err)
	}
	if len(c.SubjectSecret) < 16 {
		bad("SUBJECT_SECRET", "must be set to at least 16 bytes (e.g. `openssl rand -hex 32`)")
	}
	if _, err := tasks.ParseKeyring(c.PayloadKeys); err != nil {
		bad("PAYLOAD_KEYS", "%v", err)
	}
	if c.PayloadPlaintext != "refuse" && c.PayloadPlaintext != "accept" {
		bad("PAYLOAD_PLAINTEXT", "must be refuse or accept, got %q", c.PayloadPlaintext)
	}
	if c.DedupeTTL < time.Minute {
		bad("DEDUPE_TTL", "must be at least 1m, got %v", c.DedupeTTL)
	}
	switch c.EmailSender {
	case "log":
	case "smtp":
		if c.SMTPHost == "" {
			bad("SMTP_HOST", "must be set when SLUICE_EMAIL_SENDER=smtp")
		}
		if c.SMTPPort < 1 || c.SMTPPort > 65535 {
			bad("SMTP_PORT", "must be a port number, got %d", c.SMTPPort)
		}
		switch c.SMTPTLS {
		case "starttls", "opportunistic", "tls", "none":
		default:
			bad("SMTP_TLS", "must be starttls, opportunistic, tls or none, got %q", c.SMTPTLS)
		}
		if _, err := mail.ParseAddress(c.SMTPFrom); err != nil {
			bad("SMTP_FROM", "must be an email address when SLUICE_EMAIL_SENDER=smtp, got %q", c.SMTPFrom)
		}
		if c.SMTPCAFile != "" {
			if c.SMTPTLS == "none" {
				bad("SMTP_CA_FILE", "is set but %sSMTP_TLS=none: the connection would not use TLS", EnvPrefix)
			} else if _, err := loadCAFile(c.SMTPCAFile); err != nil {
				bad("SMTP_CA_FILE", "%v", err)
			}
		}
		if c.SMTPUser != "" && (c.SMTPTLS == "none" || c.SMTPTLS == "opportunistic") && !c.SMTPAllowPlainAuth {
			bad("SMTP_USERNAME", "is set with %sSMTP_TLS=%s: the password could cross the network unencrypted; use %sSMTP_TLS=starttls or tls, or set %sSMTP_ALLOW_PLAIN_AUTH=true",
				EnvPrefix, c.SMTPTLS, EnvPrefix, EnvPrefix)
		}
		if c.SMTPConns < 1 || c.SMTPConns > 100 {
			bad("SMTP_CONNECTIONS", "must be between 1 and 100, got %d", c.SMTPConns)
		}
	default:
		bad("EMAIL_SENDER", "must be smtp or log, got %q", c.EmailSender)
	}
	c.validateDKIM(bad)
	switch c.SMSSender {
	case "log":
	case "http":
		if u, err := url.Parse(c.SMSBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("SMS_BASE_URL", "must be an http(s) URL, got %q", c.SMSBaseURL)
		}
		if c.SMSAccountSID == "" {
			bad("SMS_ACCOUNT_SID", "must be set when SLUICE_SMS_SENDER=http")
		}
		if c.SMSAuthToken == "" {
			bad("SMS_AUTH_TOKEN", "must be set when SLUICE_SMS_SENDER=http")
		}
		if c.SMSFrom == "" && c.SMSMessagingServiceSID == "" {
			bad("SMS_FROM", "must be set when SLUICE_SMS_SENDER=http, or SLUICE_SMS_MESSAGING_SERVICE_SID instead: the From number (or the Messaging Service) of messages that name none")
		}
	default:
		bad("SMS_SENDER", "must be http or log, got %q", c.SMSSender)
	}
	if c.SMSMessagingServiceSID != "" {
		if !tasks.IsMessagingServiceSID(c.SMSMessagingServiceSID) {
			bad("SMS_MESSAGING_SERVICE_SID", "must be MG followed by 32 hex digits (a Twilio Messaging Service SID), got %q", c.SMSMessagingServiceSID)
		}
		if c.SMSFrom != "" {
			bad("SMS_MESSAGING_SERVICE_SID", "and %sSMS_FROM are both set: set one, the default origin of messages that name none", EnvPrefix)
		}
	}
	if c.SMSStatusCallbackURL != "" {
		if err := checkCallbackBase(c.SMSStatusCallbackURL); err != nil {
			bad("SMS_STATUS_CALLBACK_URL", "%v", err)
		}
		if c.SMSAuthToken == "" {
			bad("SMS_STATUS_CALLBACK_URL", "is set but %sSMS_AUTH_TOKEN is not: the API checks each callback's X-Twilio-Signature with it", EnvPrefix)
		}
	}
	if _, err := c.SuppressCodes(); err != nil {
		bad("SMS_SUPPRESS_CODES", "%v", err)
	}
	if c.SMSSuppressTTL < time.Hour || c.SMSSuppressTTL > 3650*24*time.Hour {
		bad("SMS_SUPPRESS_TTL", "must be between 1h and 87600h (10 years), got %v", c.SMSSuppressTTL)
	}
	for name, d := range map[string]time.Duration{
		"SMTP_TIMEOUT": c.SMTPTimeout, "SMS_TIMEOUT": c.SMSTimeout, "SHUTDOWN_TIMEOUT": c.ShutdownTimeout,
		"DELAYED_CHECK_INTERVAL": c.DelayedCheckInterval, "POLL_INTERVAL": c.PollInterval,
		"RETRY_BASE": c.RetryBase, "RETRY_MAX": c.RetryMax, "UNAVAILABLE_RETRY": c.UnavailableRetry,
		"PLAN_CHECK_INTERVAL": c.PlanCheckInterval,
	} {
		if d < 10*time.Millisecond {
			bad(name, "must be at least 10ms, got %v", d)
		}
	}
	if c.Reschedule != "booked" && c.Reschedule != "naive" {
		bad("RESCHEDULE", "must be booked or naive, got %q", c.Reschedule)
	}
	if c.SendSlack < 0 || c.SendSlack > time.Minute {
		bad("SEND_SLACK", "must be between 0 and 1m, got %v", c.SendSlack)
	}
	if c.MaxInlineWait < 0 || c.MaxInlineWait > time.Minute {
		bad("MAX_INLINE_WAIT", "must be between 0 and 1m, got %v", c.MaxInlineWait)
	}
	if lead := c.wakeLead() + time.Second; c.MaxInlineWait > 0 && c.MaxInlineWait < lead {
		bad("MAX_INLINE_WAIT", "must be 0 or at least SLUICE_DELAYED_CHECK_INTERVAL + SLUICE_POLL_INTERVAL + 1.1s (%v): booked tasks wake that early and wait the rest in process, got %v", lead, c.MaxInlineWait)
	}
	if c.OrphanAfter != 0 && (c.OrphanAfter < 11*time.Second || c.OrphanAfter > 10*time.Minute) {
		bad("ORPHAN_AFTER", "must be 0 (off) or between 11s and 10m: a live task's lease moves every 5 s, got %v", c.OrphanAfter)
	}
	if c.MaxWaiters < 0 || c.MaxWaiters > 100_000 {
		bad("MAX_WAITERS", "must be between 0 and 100000, got %d", c.MaxWaiters)
	}
	if c.Rerun != "at-least-once" && c.Rerun != "at-most-once" {
		bad("RERUN", "must be at-least-once or at-most-once, got %q", c.Rerun)
	}
	if c.RetryMax < c.RetryBase {
		bad("RETRY_MAX", "must be at least SLUICE_RETRY_BASE (%v), got %v", c.RetryBase, c.RetryMax)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("LOG_FORMAT", "must be text or json, got %q", c.LogFormat)
	}
	return errors.Join(errs...)
}

// validateDKIM checks the DKIM_* variables: the three main ones are set
// together or not at all, and the key file must hold a usable key.
func (c Config) validateDKIM(bad func(name, format string, args ...any)) {
	if err := checkDKIMHeaders(c.dkimHeaders()); err != nil {
		bad("DKIM_HEADERS", "%v", err)
	}
	vars := []struct{ name, value string }{{"DKIM_DOMAIN", c.DKIMDomain}, {"DKIM_SELECTOR", c.DKIMSelector}, {"DKIM_KEY_FILE", c.DKIMKeyFile}}
	var set []string
	for _, v := range vars {
		if v.value != "" {
			set = append(set, EnvPrefix+v.name)
		}
	}
	if len(set) == 0 {
		return
	}
	for _, v := range vars {
		if v.value == "" {
			bad(v.name, "must be set too: DKIM needs %sDKIM_DOMAIN, %sDKIM_SELECTOR and %sDKIM_KEY_FILE together, or none (set: %s)",
				EnvPrefix, EnvPrefix, EnvPrefix, strings.Join(set, ", "))
		}
	}
	if c.DKIMDomain != "" {
		if err := checkDKIMDomain(c.DKIMDomain); err != nil {
			bad("DKIM_DOMAIN", "%v", err)
		}
	}
	if c.DKIMSelector != "" {
		if err := checkDKIMSelector(c.DKIMSelector); err != nil {
			bad("DKIM_SELECTOR", "%v", err)
		}
	}
	if c.DKIMKeyFile != "" {
		if _, err := LoadDKIMKey(c.DKIMKeyFile); err != nil {
			bad("DKIM_KEY_FILE", "%v", err)
		}
	}
}

// dkimHeaders is DKIMHeaders with spaces around the names trimmed and
// empty entries dropped.
func (c Config) dkimHeaders() []string {
	var out []string
	for _, h := range c.DKIMHeaders {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// dkimConfig returns the sender's DKIM configuration, nil when DKIM is off.
func (c Config) dkimConfig() (*DKIMConfig, error) {
	if c.DKIMDomain == "" && c.DKIMSelector == "" && c.DKIMKeyFile == "" {
		return nil, nil
	}
	key, err := LoadDKIMKey(c.DKIMKeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %sDKIM_KEY_FILE %w", ErrConfig, EnvPrefix, err)
	}
	return &DKIMConfig{Domain: c.DKIMDomain, Selector: c.DKIMSelector, Key: key, Headers: c.dkimHeaders()}, nil
}

// checkCallbackBase says what is wrong with SMS_STATUS_CALLBACK_URL.
func checkCallbackBase(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("must be an http(s) URL like https://sluice.example.com, got %q", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(raw, "?") || strings.HasSuffix(raw, "#") {
		return fmt.Errorf("must be a base URL without user info, query or fragment (the path /v1/callbacks/sms/TENANT/ID is added to it), got %q", raw)
	}
	return nil
}

// SuppressCodes are the provider error codes of SMS_SUPPRESS_CODES; nil
// when it is none.
func (c Config) SuppressCodes() (map[int]bool, error) {
	if strings.TrimSpace(c.SMSSuppressCodes) == "none" {
		return nil, nil
	}
	out := map[int]bool{}
	for _, f := range strings.Split(c.SMSSuppressCodes, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 999999 || len(f) > 6 {
			return nil, fmt.Errorf("must be comma-separated provider error codes (1 to 6 digits, e.g. 21211,30005) or none, got %q", f)
		}
		out[n] = true
	}
	return out, nil
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

// loadCAFile reads a PEM bundle of CA certificates (SLUICE_*_CA_FILE); it
// fails unless the file is readable and holds at least one certificate.
func loadCAFile(path string) (*x509.CertPool, error) {
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

// ConfigVar describes one environment variable of Config.
type ConfigVar struct {
	Name, Default, Description string
	Secret                     bool
}

// ConfigVars lists every variable Config reads, in declaration order.
func ConfigVars() []ConfigVar { return VarsOf(Config{}) }

// VarsOf lists the variables a configuration struct reads (its env,
// envDefault, desc and secret tags), in declaration order.
func VarsOf(cfg any) []ConfigVar {
	t := reflect.TypeOf(cfg)
	out := make([]ConfigVar, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		out = append(out, ConfigVar{
			Name:        EnvPrefix + f.Tag.Get("env"),
			Default:     f.Tag.Get("envDefault"),
			Description: f.Tag.Get("desc"),
			Secret:      f.Tag.Get("secret") == "true",
		})
	}
	return out
}

// Redacted returns the effective configuration as NAME=value pairs, with
// secrets (and the password in the Redis URL) masked: safe to log.
func (c Config) Redacted() []string { return RedactedOf(c) }

// RedactedOf returns a configuration struct as NAME=value pairs, secrets
// masked (a URL keeps all but its password).
func RedactedOf(cfg any) []string {
	v := reflect.ValueOf(cfg)
	t := v.Type()
	out := make([]string, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		val := fmt.Sprint(v.Field(i).Interface())
		if s, ok := v.Field(i).Interface().([]string); ok {
			val = strings.Join(s, ",")
		}
		if f.Tag.Get("secret") == "true" && val != "" {
			if u, err := url.Parse(val); err == nil && u.Scheme != "" && u.Host != "" {
				if _, has := u.User.Password(); has {
					u.User = url.UserPassword(u.User.Username(), "xxxxx")
				}
				val = u.Redacted()
			} else {
				val = "*****"
			}
		}
		out = append(out, EnvPrefix+f.Tag.Get("env")+"="+val)
	}
	return out
}

// Layout is the queue layout of SLUICE_QUEUE and SLUICE_QUEUE_SHARDS.
func (c Config) Layout() tasks.Layout { return tasks.Layout{Base: c.Queue, Shards: c.QueueShards} }

// wakeLead bounds how late after its stored second Asynq starts a
// rescheduled task: the delayed-task check, a poll, and 100 ms of work.
func (c Config) wakeLead() time.Duration {
	return c.DelayedCheckInterval + c.PollInterval + 100*time.Millisecond
}

// ToolingVars are SLUICE_* variables read by the test and benchmark
// scripts, not by the binary: they are not reported as unknown.
var ToolingVars = []string{"SLUICE_FUZZTIME", "SLUICE_UPDATE_README", "SLUICE_HAMMER", "SLUICE_SOAK"}

// UnknownVariables reports every SLUICE_* variable of environ (nil: the
// process environment) that is not one of known, naming the closest known
// name: a misspelt SLUICE_RULE must not leave the default rules in force
// unnoticed.
func UnknownVariables(environ map[string]string, known []string) error {
	if environ == nil {
		environ = map[string]string{}
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			environ[k] = v
		}
	}
	set := map[string]bool{}
	for _, k := range known {
		set[k] = true
	}
	for _, k := range ToolingVars {
		set[k] = true
	}
	var names []string
	for k := range environ {
		if strings.HasPrefix(k, EnvPrefix) && !set[k] {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var errs []error
	for _, k := range names {
		hint := ""
		if near := closest(k, known); near != "" {
			hint = "; did you mean " + near + "?"
		}
		errs = append(errs, fmt.Errorf("%w: %s is not a Sluice variable%s", ErrConfig, k, hint))
	}
	return errors.Join(errs...)
}

// KnownVariables are the names Config reads.
func KnownVariables() []string {
	var out []string
	for _, v := range ConfigVars() {
		out = append(out, v.Name)
	}
	return out
}

// closest returns the known name nearest to name by edit distance, if it
// is near enough to be a slip (at most a third of the name's length).
func closest(name string, known []string) string {
	best, bestD := "", len(name)/3+1
	for _, k := range known {
		if d := editDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
