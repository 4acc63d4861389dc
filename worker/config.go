package worker

import (
	"net/mail"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/providers"
	"github.com/sluicehq/sluice/tasks"
)

// Config is the worker's configuration: the shared settings (config.Base)
// and the worker's own, read from SLUICE_* environment variables. Every
// field has a default (envDefault) and a description (desc), from which the
// configuration table is generated. The selected senders' own settings
// (sender/smtp, sender/twilio) are read from the same environment when the
// worker opens them.
type Config struct {
	config.Base
	Concurrency           int           `env:"CONCURRENCY" envDefault:"10" desc:"Standard and bulk tasks taken at once per worker (besides those waiting in process for their slot: MAX_WAITERS), and the most standard and bulk requests the worker has at its providers at once, the sends that waited for their slot included (they queue for a request slot in slot order; sluice_provider_inflight). When a send would wait for a request slot longer than a quarter of SEND_SLACK (slow providers, a long queue), it takes its slot before its quota check, so it is admitted only when it can go at once, not admitted and then checked again (sluice_late_wakes_total)."`
	PriorityConcurrency   int           `env:"PRIORITY_CONCURRENCY" envDefault:"4" desc:"Priority-lane tasks (exempt categories: OTPs, fraud alerts) processed at once per worker, on their own dequeuer and slots, so nothing in the standard or bulk lanes is ever ahead of them; also the most priority-lane requests the worker has at its providers at once (on top of CONCURRENCY)."`
	BulkWeight            int           `env:"BULK_WEIGHT" envDefault:"1" desc:"Weight (1-16) of each bulk shard in the dequeuer it shares with the standard lane, against 4 for each standard shard: with work waiting in both, bulk gets about WEIGHT/(4+WEIGHT) of the picks (1: a fifth), so it never starves standard nor is starved."`
	Dequeuers             int           `env:"DEQUEUERS" envDefault:"2" desc:"Asynq servers (1-8) a worker runs for the standard and bulk lanes, sharing CONCURRENCY + MAX_WAITERS between them. An Asynq server takes its tasks from Redis one round trip after the other, so one caps a busy worker at one task per round trip; two drained a booked flood of 100,000 in 17 % less time (docs/BENCHMARKS.md). Each costs about 2.4 Redis commands/s while idle (heartbeats)."`
	QueueRecheck          time.Duration `env:"QUEUE_RECHECK" envDefault:"10s" desc:"An idle worker does not poll queues Redis reported unchanged (client-side-caching invalidations, CLIENT TRACKING); it polls each anyway after this long. 0 turns that off: every queue is polled every POLL_INTERVAL and DELAYED_CHECK_INTERVAL, as plain Asynq does."`
	HTTPAddr              string        `env:"HTTP_ADDR" envDefault:":9090" desc:"Listen address of /metrics, /healthz and /readyz; off disables it."`
	ShutdownTimeout       time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s" desc:"On SIGTERM, how long in-flight sends may finish before their tasks are handed back to the queue."`
	Reschedule            string        `env:"RESCHEDULE" envDefault:"booked" desc:"How a task whose slot lies ahead waits: booked (the limiter books the slot; about 2 checks per send in a backlog) or naive (it is woken when the slot opens and competes for it)."`
	MaxInlineWait         time.Duration `env:"MAX_INLINE_WAIT" envDefault:"2s" desc:"A slot at most this far ahead is waited for inside the worker (to the millisecond) instead of through Asynq's whole-second scheduler; booked tasks are woken early by up to a second plus DELAYED_CHECK_INTERVAL + POLL_INTERVAL + 100ms and wait the rest here, so keep it above that."`
	MaxWaiters            int           `env:"MAX_WAITERS" envDefault:"256" desc:"Tasks that may wait in process for their slot at once, on top of CONCURRENCY and PRIORITY_CONCURRENCY (each lane's Asynq server runs its concurrency + MAX_WAITERS tasks, so waiting never blocks sending). Size it to the booked tasks whose slots fall within MAX_INLINE_WAIT of each other: a task that finds none free goes back through Asynq's whole-second scheduler, arrives late and loses a window (the default was 32 until a backlog of 30 recipients, whose 60 slots coincide, drained at 1.5× the exact scheduler's time)."`
	DequeueBatch          int           `env:"DEQUEUE_BATCH" envDefault:"16" desc:"Most tasks of one shard a dequeue takes in one round trip, when that many of the lane's processors are idle: the first runs at once, the others are handed to the next idle processors without a round trip. Each is leased from the moment it is taken (recovered like any leased task if the worker dies); a worker that stops puts back those not started. 1: one task a round trip, as Asynq's own dequeue."`
	CohortWait            time.Duration `env:"COHORT_WAIT" envDefault:"2ms" desc:"How long the checks of tasks one dequeue took together (DEQUEUE_BATCH) wait for each other, to go to Redis as one call: the first to ask waits at most this for the rest. A task taken alone never waits."`
	DoneLinger            time.Duration `env:"DONE_LINGER" envDefault:"1ms" desc:"How long a done record written on its own may wait for the next quota check to carry it (one round trip for both). A sent task's record goes with the task's completion (the same pipeline, ahead of it); only one no completion carries within 50 ms (a task with a retention or a uniqueness lock) is written on its own. 0: at once."`
	Rerun                 string        `env:"RERUN" envDefault:"at-least-once" desc:"A task that runs again after an attempt whose outcome is unknown (admitted, neither recorded as sent nor released: a crash mid-send): at-least-once sends again and counts the re-send as a fresh message in every window; at-most-once archives it (reason outcome_unknown)."`
	DelayedCheckInterval  time.Duration `env:"DELAYED_CHECK_INTERVAL" envDefault:"250ms" desc:"How often due rescheduled tasks are moved to the queue (Asynq's DelayedTaskCheckInterval); bounds how late a throttled task wakes."`
	PollInterval          time.Duration `env:"POLL_INTERVAL" envDefault:"100ms" desc:"How often an idle worker polls for tasks (Asynq's TaskCheckInterval)."`
	RetryBase             time.Duration `env:"RETRY_BASE" envDefault:"2s" desc:"First backoff of a failed send; doubles per retry."`
	RetryMax              time.Duration `env:"RETRY_MAX" envDefault:"10m" desc:"Longest backoff of a failed send."`
	OrphanAfter           time.Duration `env:"ORPHAN_AFTER" envDefault:"15s" desc:"A task Asynq holds as active whose lease has not been extended for this long (while Redis answered) and that no live worker lists is put back at the head of the queue: a worker killed mid-task, or a dequeue whose reply Redis lost as it died. Asynq's own recovery takes 60-120 s. At least 11s (two of Asynq's 5 s heartbeats and a margin); 0 leaves it to Asynq."`
	HeldDeadAfter         time.Duration `env:"HELD_DEAD_AFTER" envDefault:"1s" desc:"A worker holding sends for their slots (admitted for a slot up to MAX_INLINE_WAIT ahead) stamps itself in Redis every 250 ms; one not stamped for this long, by Redis's clock, is presumed dead (two reads 250 ms apart find the same old stamp) and another worker takes its sends over, their slots kept: within 1.5 s of its stop, instead of ORPHAN_AFTER. A live worker whose stamps were late loses its sends to the takeover and does not send them (no send goes twice). Between 750ms and 10s; 0 leaves them to ORPHAN_AFTER. Needs ORPHAN_AFTER on."`
	UnavailableRetry      time.Duration `env:"UNAVAILABLE_RETRY" envDefault:"2s" desc:"When Redis cannot be asked for a quota, how long until the task is tried again (nothing is sent meanwhile)."`
	RedisWaitReplicas     int           `env:"REDIS_WAIT_REPLICAS" envDefault:"0" desc:"Replicas that must acknowledge each admission (Redis WAIT, right after the quota check on the same connection; on a Cluster to the master of the tenant's slot) before the send goes out, so a failover cannot lose an admission a send went out on. Fewer within REDIS_WAIT_TIMEOUT: nothing is sent, the admission is given back and the task tries again, as when Redis is unreachable. A send acknowledged later than half SEND_SLACK after its slot is asked again, not sent late: set SEND_SLACK to at least twice REDIS_WAIT_TIMEOUT. 0: no wait (Redis replicates asynchronously)."`
	RedisWaitTimeout      time.Duration `env:"REDIS_WAIT_TIMEOUT" envDefault:"500ms" desc:"How long an admission waits for REDIS_WAIT_REPLICAS acknowledgements (1ms to 2s)."`
	EmailSender           string        `env:"EMAIL_SENDER" envDefault:"log" desc:"Email sender: smtp, or log (writes to the log, sends nothing); the providers are listed in sender/providers."`
	SMSSender             string        `env:"SMS_SENDER" envDefault:"log" desc:"SMS sender: http (Twilio-compatible Messages API), or log; the providers are listed in sender/providers."`
	SMSProviders          []string      `env:"SMS_PROVIDERS" envSeparator:"," desc:"SMS providers in the order they are tried, e.g. default,backup (docs/channels.md, \"Failover\"): default is the one SMS_SENDER and its variables configure; any other NAME is configured by the same variables under SLUICE_PROVIDER_NAME_ (SLUICE_PROVIDER_BACKUP_SMS_SENDER=http, SLUICE_PROVIDER_BACKUP_SMS_BASE_URL=..., and its own SLUICE_PROVIDER_BACKUP_SMS_FROM, else SMS_FROM's; the list: docs/configuration.md, \"Per-provider variables\"). Empty: SMS_SENDER alone."`
	EmailProviders        []string      `env:"EMAIL_PROVIDERS" envSeparator:"," desc:"Email providers in the order they are tried, as SMS_PROVIDERS (SLUICE_PROVIDER_NAME_EMAIL_SENDER=smtp, SLUICE_PROVIDER_NAME_SMTP_HOST=...). Empty: EMAIL_SENDER alone."`
	WhatsAppSender        string        `env:"WHATSAPP_SENDER" envDefault:"log" desc:"WhatsApp sender: cloud (Meta's WhatsApp Cloud API), or log; the providers are listed in sender/providers."`
	WhatsAppProviders     []string      `env:"WHATSAPP_PROVIDERS" envSeparator:"," desc:"WhatsApp providers in the order they are tried, as SMS_PROVIDERS (SLUICE_PROVIDER_NAME_WHATSAPP_SENDER=cloud, ...). Empty: WHATSAPP_SENDER alone."`
	FailoverGrace         time.Duration `env:"FAILOVER_GRACE" envDefault:"10s" desc:"With several providers: how long standard and bulk sends wait for a provider that is down or held before they go to the next one (a hold that ends sooner is waited for). Priority-lane sends go to the next at once."`
	ProviderFailures      int           `env:"PROVIDER_FAILURES" envDefault:"3" desc:"With several providers: transient failures at a provider (refused connections, timeouts, 5xx), counted by every worker within PROVIDER_FAILURE_WINDOW, that mark it down (a circuit breaker kept in Redis)."`
	ProviderFailureWindow time.Duration `env:"PROVIDER_FAILURE_WINDOW" envDefault:"10s" desc:"The window PROVIDER_FAILURES are counted in."`
	ProviderCooldown      time.Duration `env:"PROVIDER_COOLDOWN" envDefault:"5s" desc:"How long a provider marked down gets no requests; then one worker sends one request to it (a probe): one that succeeds takes it back, one that fails marks it down again for as long."`

	// Environ is where the senders' settings are read from (nil: the
	// process environment); ParseConfig and ReadConfig set it.
	Environ map[string]string `env:"-"`
}

// LoadConfig reads the configuration from the environment (SLUICE_*); every
// value parses, and app.NewWorker validates it (once: Config.Validate).
func LoadConfig() (Config, error) { return ReadConfig(nil) }

// ParseConfig reads the configuration from environ (KEY=VALUE pairs, nil for
// the process environment) and validates it, the selected senders' settings
// included.
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
	var cfg Config
	if err := config.Read(environ, &cfg); err != nil {
		return Config{}, err
	}
	cfg.Environ = environ
	return cfg, nil
}

// Validate checks every field, and the settings of the selected senders;
// each error names the variable and the bound.
func (c Config) Validate() error {
	var p config.Problems
	c.Base.Validate(&p)
	c.validateServers(&p)
	c.validateSenders(&p)
	c.validateFailover(&p)
	c.validateTimings(&p)
	return p.Err()
}

// validateServers checks how the Asynq servers take work and wait for
// replicas: CONCURRENCY, PRIORITY_CONCURRENCY, BULK_WEIGHT, QUEUE_RECHECK,
// REDIS_WAIT_REPLICAS and REDIS_WAIT_TIMEOUT.
func (c Config) validateServers(p *config.Problems) {
	if c.Concurrency < 1 || c.Concurrency > 10_000 {
		p.Add("CONCURRENCY", "must be between 1 and 10000, got %d", c.Concurrency)
	}
	if c.PriorityConcurrency < 1 || c.PriorityConcurrency > 10_000 {
		p.Add("PRIORITY_CONCURRENCY", "must be between 1 and 10000, got %d", c.PriorityConcurrency)
	}
	if c.BulkWeight < 1 || c.BulkWeight > 16 {
		p.Add("BULK_WEIGHT", "must be between 1 and 16, got %d", c.BulkWeight)
	}
	if c.DequeueBatch < 1 || c.DequeueBatch > 256 {
		p.Add("DEQUEUE_BATCH", "must be between 1 and 256, got %d", c.DequeueBatch)
	}
	if c.Dequeuers < 1 || c.Dequeuers > 8 {
		p.Add("DEQUEUERS", "must be between 1 and 8, got %d", c.Dequeuers)
	}
	if c.QueueRecheck != 0 && (c.QueueRecheck < time.Second || c.QueueRecheck > 10*time.Minute) {
		p.Add("QUEUE_RECHECK", "must be 0 (off) or between 1s and 10m, got %v", c.QueueRecheck)
	}
	if c.RedisWaitReplicas < 0 || c.RedisWaitReplicas > 16 {
		p.Add("REDIS_WAIT_REPLICAS", "must be between 0 (no wait) and 16, got %d", c.RedisWaitReplicas)
	}
	if c.RedisWaitTimeout < time.Millisecond || c.RedisWaitTimeout > 2*time.Second {
		p.Add("REDIS_WAIT_TIMEOUT", "must be between 1ms and 2s (below the Redis client's 5 s read timeout), got %v", c.RedisWaitTimeout)
	}
}

// validateSenders checks each channel's providers (EMAIL_SENDER and
// SMS_SENDER, or the lists EMAIL_PROVIDERS and SMS_PROVIDERS) and their
// settings, then the settings the API shares with the providers not
// selected.
func (c Config) validateSenders(p *config.Problems) {
	for _, ch := range Channels {
		specs, err := c.Providers(ch)
		if err != nil {
			p.Join(err.(*providerProblems).p)
			continue
		}
		for _, s := range specs {
			prov, _ := sender.Lookup(providers.All, ch, s.Kind)
			st, err := prov.NewSettings(s.Environ)
			if err != nil {
				q := config.Problems{Scope: s.Scope}
				q.Add(senderVar(ch), "%v", err)
				p.Join(&q)
				continue
			}
			q := config.Problems{Scope: s.Scope}
			validateProviderSender(ch, s, &q)
			if st != nil {
				st.Validate(s.Base, &q)
			}
			p.Join(&q)
		}
	}
	// Settings that the API reads too, of the providers not selected.
	for _, prov := range providers.All {
		if _, kind, _ := c.channelProviders(prov.Channel); prov.Name == kind {
			continue
		}
		if st, err := prov.NewSettings(c.Environ); err == nil {
			if sh, ok := st.(sender.SharedSettings); ok {
				sh.ValidateShared(p)
			}
		}
	}
}

// validateFailover checks the provider breaker's settings.
func (c Config) validateFailover(p *config.Problems) {
	if c.FailoverGrace < 0 || c.FailoverGrace > time.Hour {
		p.Add("FAILOVER_GRACE", "must be between 0 and 1h, got %v", c.FailoverGrace)
	}
	if c.ProviderFailures < 1 || c.ProviderFailures > 1000 {
		p.Add("PROVIDER_FAILURES", "must be between 1 and 1000, got %d", c.ProviderFailures)
	}
	if c.ProviderFailureWindow < 100*time.Millisecond || c.ProviderFailureWindow > time.Hour {
		p.Add("PROVIDER_FAILURE_WINDOW", "must be between 100ms and 1h, got %v", c.ProviderFailureWindow)
	}
	if c.ProviderCooldown < 100*time.Millisecond || c.ProviderCooldown > time.Hour {
		p.Add("PROVIDER_COOLDOWN", "must be between 100ms and 1h, got %v", c.ProviderCooldown)
	}
}

// DefaultProvider names the provider that the unnamed variables
// (SLUICE_SMS_SENDER and its settings) configure.
const DefaultProvider = "default"

// maxProviders bounds a channel's list.
const maxProviders = 8

// ProviderSpec is one provider of a channel's list (SMS_PROVIDERS,
// EMAIL_PROVIDERS).
type ProviderSpec struct {
	// Name is its name in the list; DefaultProvider for the provider the
	// unnamed variables configure.
	Name string
	// Kind is the provider package it uses (sender/providers: http, telnyx,
	// smtp, log): its SLUICE_[PROVIDER_NAME_]SMS_SENDER or EMAIL_SENDER.
	Kind string
	// Scope is what its variables carry after SLUICE_ ("PROVIDER_BACKUP_";
	// "" for the default), and Environ those variables without it: what
	// its settings are read from.
	Scope   string
	Environ map[string]string
	// Base is the shared settings as the provider reads them: a named
	// provider's own sender settings (ProviderSenderVars: its From number,
	// messaging service, From address or WhatsApp number) in place of the
	// deployment's, where it sets them.
	Base config.Base
}

// ProviderSenderVars are the sender settings a named provider of ch may
// set under its prefix (SLUICE_PROVIDER_NAME_SMS_FROM, ...), each in place
// of the deployment's variable of the same name: a backup account has
// numbers and addresses of its own. SMS_FROM and SMS_MESSAGING_SERVICE_SID
// go together: one set for a provider replaces both of the deployment's.
func ProviderSenderVars(ch tasks.Channel) []string {
	switch ch {
	case tasks.Email:
		return []string{"SMTP_FROM"}
	case tasks.WhatsApp:
		return []string{"WHATSAPP_PHONE_NUMBER_ID"}
	}
	return []string{"SMS_FROM", "SMS_MESSAGING_SERVICE_SID"}
}

// providerBase is c.Base with s's own sender settings (ProviderSenderVars)
// in place of the deployment's.
func (c Config) providerBase(ch tasks.Channel, s ProviderSpec) config.Base {
	b := c.Base
	if s.Name == DefaultProvider {
		return b
	}
	get := func(k string) string { return strings.TrimSpace(s.Environ[config.EnvPrefix+k]) }
	switch ch {
	case tasks.SMS:
		if from, mss := get("SMS_FROM"), get("SMS_MESSAGING_SERVICE_SID"); from != "" || mss != "" {
			b.SMSFrom, b.SMSMessagingServiceSID = from, mss
		}
	case tasks.Email:
		if v := get("SMTP_FROM"); v != "" {
			b.SMTPFrom = v
		}
	case tasks.WhatsApp:
		if v := get("WHATSAPP_PHONE_NUMBER_ID"); v != "" {
			b.WhatsAppFrom = v
		}
	}
	return b
}

// validateProviderSender checks a named provider's own sender settings,
// as config.Base checks the deployment's.
func validateProviderSender(ch tasks.Channel, s ProviderSpec, p *config.Problems) {
	if s.Name == DefaultProvider {
		return
	}
	b := s.Base
	switch ch {
	case tasks.SMS:
		if b.SMSMessagingServiceSID != "" && !tasks.IsMessagingServiceSID(b.SMSMessagingServiceSID) {
			p.Add("SMS_MESSAGING_SERVICE_SID", "must be MG followed by 32 hex digits (a Twilio Messaging Service SID), got %q", b.SMSMessagingServiceSID)
		}
		if b.SMSMessagingServiceSID != "" && b.SMSFrom != "" {
			p.Add("SMS_MESSAGING_SERVICE_SID", "and %s%sSMS_FROM are both set: set one, the provider's origin of messages that name none", config.EnvPrefix, s.Scope)
		}
	case tasks.Email:
		if s.Environ[config.EnvPrefix+"SMTP_FROM"] == "" {
			return // the deployment's, checked as such
		}
		if _, err := mail.ParseAddress(b.SMTPFrom); err != nil {
			p.Add("SMTP_FROM", "must be an email address, got %q: %v", b.SMTPFrom, err)
		}
	case tasks.WhatsApp:
		if s.Environ[config.EnvPrefix+"WHATSAPP_PHONE_NUMBER_ID"] != "" && strings.Trim(b.WhatsAppFrom, "0123456789") != "" {
			p.Add("WHATSAPP_PHONE_NUMBER_ID", "must be a Cloud API phone-number id (digits), got %q", b.WhatsAppFrom)
		}
	}
}

// providerProblems is a list that cannot be used.
type providerProblems struct{ p *config.Problems }

func (e *providerProblems) Error() string { return e.p.Err().Error() }
func (e *providerProblems) Unwrap() error { return e.p.Err() }

// Providers returns ch's providers in the order they are tried: the list
// EMAIL_PROVIDERS or SMS_PROVIDERS names, or the one EMAIL_SENDER or
// SMS_SENDER selects when the list is empty.
func (c Config) Providers(ch tasks.Channel) ([]ProviderSpec, error) {
	names, kind, listVar := c.channelProviders(ch)
	if len(names) == 0 {
		names = []string{DefaultProvider}
	}
	var p config.Problems
	if len(names) > maxProviders {
		p.Add(listVar, "names %d providers; at most %d", len(names), maxProviders)
	}
	seen := map[string]bool{}
	var out []ProviderSpec
	for _, name := range names {
		name = strings.TrimSpace(name)
		if !plans.ValidProviderName(name) {
			p.Add(listVar, "has %q: a provider's name is a lower-case letter, then up to 15 lower-case letters and digits", name)
			continue
		}
		if seen[name] {
			p.Add(listVar, "names %q twice", name)
			continue
		}
		seen[name] = true
		s := ProviderSpec{Name: name, Kind: kind, Environ: c.Environ}
		if name != DefaultProvider {
			s.Scope = "PROVIDER_" + strings.ToUpper(name) + "_"
			s.Environ = config.Scoped(c.Environ, s.Scope)
			s.Kind = s.Environ[config.EnvPrefix+senderVar(ch)]
		}
		s.Base = c.providerBase(ch, s)
		if _, ok := sender.Lookup(providers.All, ch, s.Kind); !ok {
			q := config.Problems{Scope: s.Scope}
			q.Add(senderVar(ch), "must be %s, got %q", strings.Join(sender.Names(providers.All, ch), " or "), s.Kind)
			p.Join(&q)
			continue
		}
		out = append(out, s)
	}
	if err := p.Err(); err != nil {
		return nil, &providerProblems{&p}
	}
	return out, nil
}

// Channels are the channels a worker sends on, each with its providers.
var Channels = []tasks.Channel{tasks.Email, tasks.SMS, tasks.WhatsApp}

// channelProviders: a channel's provider list, its default provider's
// kind (the SENDER variable's value) and the list's variable.
func (c Config) channelProviders(ch tasks.Channel) ([]string, string, string) {
	switch ch {
	case tasks.Email:
		return c.EmailProviders, c.EmailSender, "EMAIL_PROVIDERS"
	case tasks.WhatsApp:
		return c.WhatsAppProviders, c.WhatsAppSender, "WHATSAPP_PROVIDERS"
	}
	return c.SMSProviders, c.SMSSender, "SMS_PROVIDERS"
}

// senderVar is the variable that selects a channel's provider package.
func senderVar(ch tasks.Channel) string {
	switch ch {
	case tasks.Email:
		return "EMAIL_SENDER"
	case tasks.WhatsApp:
		return "WHATSAPP_SENDER"
	}
	return "SMS_SENDER"
}

// ProviderVariables are the variables of the named providers environ's
// lists configure (SLUICE_PROVIDER_BACKUP_SMS_SENDER, and every variable of
// the channel's provider packages under that scope): names the unknown
// variable check accepts.
func ProviderVariables(environ map[string]string) []string {
	c, err := ReadConfig(environ)
	if err != nil {
		return nil
	}
	var out []string
	for _, ch := range Channels {
		names, _, _ := c.channelProviders(ch)
		for _, name := range names {
			name = strings.TrimSpace(name)
			if !plans.ValidProviderName(name) || name == DefaultProvider {
				continue
			}
			scope := config.EnvPrefix + "PROVIDER_" + strings.ToUpper(name) + "_"
			out = append(out, scope+senderVar(ch))
			for _, v := range ProviderSenderVars(ch) {
				out = append(out, scope+v)
			}
			for _, prov := range providers.All {
				if prov.Channel != ch || prov.Settings == nil {
					continue
				}
				for _, v := range config.Vars(prov.Settings()) {
					out = append(out, scope+strings.TrimPrefix(v.Name, config.EnvPrefix))
				}
			}
		}
	}
	return out
}

// validateTimings checks the intervals, waits and retries of sends: the
// durations with a 10 ms floor, RESCHEDULE, DONE_LINGER, MAX_INLINE_WAIT,
// ORPHAN_AFTER, MAX_WAITERS, RERUN and RETRY_MAX.
func (c Config) validateTimings(p *config.Problems) {
	for name, d := range map[string]time.Duration{
		"SHUTDOWN_TIMEOUT": c.ShutdownTimeout, "DELAYED_CHECK_INTERVAL": c.DelayedCheckInterval, "POLL_INTERVAL": c.PollInterval,
		"RETRY_BASE": c.RetryBase, "RETRY_MAX": c.RetryMax, "UNAVAILABLE_RETRY": c.UnavailableRetry,
	} {
		if d < 10*time.Millisecond {
			p.Add(name, "must be at least 10ms, got %v", d)
		}
	}
	if c.Reschedule != "booked" && c.Reschedule != "naive" {
		p.Add("RESCHEDULE", "must be booked or naive, got %q", c.Reschedule)
	}
	if c.CohortWait < 0 || c.CohortWait > 100*time.Millisecond {
		p.Add("COHORT_WAIT", "must be between 0 and 100ms, got %v", c.CohortWait)
	}
	if c.DoneLinger < 0 || c.DoneLinger > 100*time.Millisecond {
		p.Add("DONE_LINGER", "must be between 0 and 100ms, got %v", c.DoneLinger)
	}
	if c.MaxInlineWait < 0 || c.MaxInlineWait > time.Minute {
		p.Add("MAX_INLINE_WAIT", "must be between 0 and 1m, got %v", c.MaxInlineWait)
	}
	if lead := c.wakeLead() + time.Second; c.MaxInlineWait > 0 && c.MaxInlineWait < lead {
		p.Add("MAX_INLINE_WAIT", "must be 0 or at least SLUICE_DELAYED_CHECK_INTERVAL + SLUICE_POLL_INTERVAL + 1.1s (%v): booked tasks wake that early and wait the rest in process, got %v", lead, c.MaxInlineWait)
	}
	if c.OrphanAfter != 0 && (c.OrphanAfter < 11*time.Second || c.OrphanAfter > 10*time.Minute) {
		p.Add("ORPHAN_AFTER", "must be 0 (off) or between 11s and 10m: a live task's lease moves every 5 s, got %v", c.OrphanAfter)
	}
	if c.HeldDeadAfter != 0 && (c.HeldDeadAfter < 750*time.Millisecond || c.HeldDeadAfter > 10*time.Second) {
		p.Add("HELD_DEAD_AFTER", "must be 0 (off) or between 750ms and 10s: a worker holding sends stamps itself every 250 ms, got %v", c.HeldDeadAfter)
	}
	if c.MaxWaiters < 0 || c.MaxWaiters > 100_000 {
		p.Add("MAX_WAITERS", "must be between 0 and 100000, got %d", c.MaxWaiters)
	}
	if c.Rerun != "at-least-once" && c.Rerun != "at-most-once" {
		p.Add("RERUN", "must be at-least-once or at-most-once, got %q", c.Rerun)
	}
	if c.RetryMax < c.RetryBase {
		p.Add("RETRY_MAX", "must be at least SLUICE_RETRY_BASE (%v), got %v", c.RetryBase, c.RetryMax)
	}
}

// Redacted returns the effective configuration as NAME=value pairs, with
// secrets masked (the selected senders' settings included): safe to log.
func (c Config) Redacted() []string {
	out := config.Redacted(c)
	for _, ch := range Channels {
		specs, _ := c.Providers(ch)
		for _, s := range specs {
			prov, _ := sender.Lookup(providers.All, ch, s.Kind)
			st, err := prov.NewSettings(s.Environ)
			if err != nil || st == nil {
				continue
			}
			for _, kv := range config.Redacted(st) {
				out = append(out, config.EnvPrefix+s.Scope+strings.TrimPrefix(kv, config.EnvPrefix))
			}
			if s.Name == DefaultProvider {
				continue
			}
			for _, v := range ProviderSenderVars(ch) {
				if val := s.Environ[config.EnvPrefix+v]; val != "" {
					out = append(out, config.EnvPrefix+s.Scope+v+"="+val)
				}
			}
		}
	}
	return out
}

// ConfigVars lists every variable the worker reads: its Config, then every
// provider's settings, each once.
func ConfigVars() []config.Var {
	out := config.Vars(Config{})
	seen := map[string]bool{}
	for _, v := range out {
		seen[v.Name] = true
	}
	for _, v := range sender.Vars(providers.All) {
		if !seen[v.Name] {
			out = append(out, v)
		}
	}
	return out
}

// KnownVariables are the names ConfigVars lists.
func KnownVariables() []string {
	var out []string
	for _, v := range ConfigVars() {
		out = append(out, v.Name)
	}
	return slices.Compact(out)
}

// wakeFor is when Asynq should run again a task that is to run at at: a
// wakeLead before it when at is far enough ahead for the rest to be waited
// in process (MaxInlineWait), else at's second rounded up (records.wakeTime
// says why).
func (c Config) wakeFor(at time.Time) time.Time {
	lead := c.wakeLead()
	if time.Until(at) > lead+time.Second && c.MaxInlineWait >= lead+time.Second {
		return at.Add(-lead)
	}
	return slotTime(at)
}

// wakeLead bounds how late after its stored second Asynq starts a
// rescheduled task: the delayed-task check, a poll, and 100 ms of work.
func (c Config) wakeLead() time.Duration {
	return c.DelayedCheckInterval + c.PollInterval + 100*time.Millisecond
}
