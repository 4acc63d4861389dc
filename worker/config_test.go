package worker_test

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/testkit/tlstest"
	"github.com/sluicehq/sluice/worker"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := worker.ParseConfig(map[string]string{"SLUICE_SUBJECT_SECRET": "0123456789abcdef", "SLUICE_PAYLOAD_KEYS": testKeys})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Queue != "notifications" || cfg.Concurrency != 10 || cfg.DelayedCheckInterval != 250*time.Millisecond || cfg.HTTPAddr != ":9090" {
		t.Fatalf("defaults: %+v", cfg)
	}
	for _, v := range worker.ConfigVars() {
		if v.Description == "" {
			t.Errorf("%s has no description", v.Name)
		}
	}
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	cases := map[string]map[string]string{
		"SLUICE_SUBJECT_SECRET":  {},
		"SLUICE_RULES":           {"SLUICE_RULES": "sms:recipient=0/1m"},
		"SLUICE_CONCURRENCY":     {"SLUICE_CONCURRENCY": "0"},
		"SLUICE_EMAIL_SENDER":    {"SLUICE_EMAIL_SENDER": "pigeon"},
		"SLUICE_SMS_ACCOUNT_SID": {"SLUICE_SMS_SENDER": "http"},
		"SLUICE_REDIS_URL":       {"SLUICE_REDIS_URL": "http://x"},
		"SLUICE_SMTP_TLS":        {"SLUICE_EMAIL_SENDER": "smtp", "SLUICE_SMTP_TLS": "maybe"},
		"SLUICE_LOG_LEVEL":       {"SLUICE_LOG_LEVEL": "loud"},
		"SLUICE_PAYLOAD_KEYS":    {"SLUICE_PAYLOAD_KEYS": "k1:short"},
	}
	for name, env := range cases {
		if _, ok := env["SLUICE_SUBJECT_SECRET"]; !ok && name != "SLUICE_SUBJECT_SECRET" {
			env["SLUICE_SUBJECT_SECRET"] = "0123456789abcdef"
		}
		if name != "SLUICE_PAYLOAD_KEYS" {
			env["SLUICE_PAYLOAD_KEYS"] = testKeys
		}
		_, err := worker.ParseConfig(env)
		if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: err = %v, want a config error naming %s", env, err, name)
		}
	}
	if _, err := worker.ParseConfig(map[string]string{"SLUICE_CONCURRENCY": "ten"}); !errors.Is(err, config.ErrConfig) {
		t.Errorf("unparseable int: %v", err)
	}
}

func TestRedactedMasksSecrets(t *testing.T) {
	t.Parallel()
	cfg, err := worker.ParseConfig(map[string]string{
		"SLUICE_SUBJECT_SECRET": "super-secret-hmac-key",
		"SLUICE_PAYLOAD_KEYS":   testKeys,
		"SLUICE_REDIS_URL":      "redis://user:hunter2@redis:6379/0",
		"SLUICE_SMTP_PASSWORD":  "smtp-pass-123",
		"SLUICE_SMS_AUTH_TOKEN": "sms-token-456",
	})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(cfg.Redacted(), "\n")
	for _, secret := range []string{"super-secret-hmac-key", "hunter2", "smtp-pass-123", "sms-token-456", testKeys[5:]} {
		if strings.Contains(all, secret) {
			t.Errorf("Redacted leaks %q", secret)
		}
	}
	if !strings.Contains(all, "SLUICE_REDIS_URL=redis://user:xxxxx@redis:6379/0") {
		t.Errorf("Redis URL not kept readable:\n%s", all)
	}
}

// A misspelt or unknown SLUICE_* variable is reported with the closest
// known name; tooling variables and other prefixes are left alone.
func TestUnknownVariables(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SLUICE_RULE": "sms:recipient=1/1m", "SLUICE_CONCURENCY": "4", "SLUICE_WHATEVER_ELSE_ENTIRELY": "x",
		"SLUICE_RULES": "sms:recipient=1/1m", "SLUICE_FUZZTIME": "5s", "PATH": "/bin", "OTEL_SERVICE_NAME": "x"}
	err := config.UnknownVariables(env, worker.KnownVariables())
	if !errors.Is(err, config.ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"SLUICE_RULE is not a Sluice variable; did you mean SLUICE_RULES?",
		"SLUICE_CONCURENCY is not a Sluice variable; did you mean SLUICE_CONCURRENCY?",
		"SLUICE_WHATEVER_ELSE_ENTIRELY is not a Sluice variable"} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	for _, not := range []string{"SLUICE_FUZZTIME", "PATH", "OTEL", "SLUICE_RULES is", "ENTIRELY is not a Sluice variable; did"} {
		if strings.Contains(msg, not) {
			t.Errorf("%q reported:\n%s", not, msg)
		}
	}
	if err := config.UnknownVariables(map[string]string{"SLUICE_RULES": "x"}, worker.KnownVariables()); err != nil {
		t.Fatalf("known only: %v", err)
	}
}

// Settings that need each other fail at start, naming the variables; a bad
// Redis URL says what is wrong with it.
func TestConfigCrossChecks(t *testing.T) {
	t.Parallel()
	base := func(kv ...string) map[string]string {
		m := map[string]string{"SLUICE_SUBJECT_SECRET": "0123456789abcdef", "SLUICE_PAYLOAD_KEYS": testKeys}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		env  map[string]string
		want string
	}{
		{base("SLUICE_SMS_SENDER", "http", "SLUICE_SMS_ACCOUNT_SID", "AC1", "SLUICE_SMS_AUTH_TOKEN", "t"), "SLUICE_SMS_FROM must be set when SLUICE_SMS_SENDER=http, or SLUICE_SMS_MESSAGING_SERVICE_SID instead"},
		{base("SLUICE_SMS_MESSAGING_SERVICE_SID", "MG123"), "SLUICE_SMS_MESSAGING_SERVICE_SID must be MG followed by 32 hex digits"},
		{base("SLUICE_SMS_MESSAGING_SERVICE_SID", "MG0123456789abcdef0123456789abcdef", "SLUICE_SMS_FROM", "+15005550006"), "SLUICE_SMS_MESSAGING_SERVICE_SID and SLUICE_SMS_FROM are both set"},
		{base("SLUICE_SMS_STATUS_CALLBACK_URL", "ftp://sluice.example.com"), "SLUICE_SMS_STATUS_CALLBACK_URL must be an http(s) URL"},
		{base("SLUICE_SMS_STATUS_CALLBACK_URL", "https://sluice.example.com?x=1", "SLUICE_SMS_AUTH_TOKEN", "t"), "SLUICE_SMS_STATUS_CALLBACK_URL must be a base URL without user info, query or fragment"},
		{base("SLUICE_SMS_STATUS_CALLBACK_URL", "https://sluice.example.com"), "SLUICE_SMS_STATUS_CALLBACK_URL is set but SLUICE_SMS_AUTH_TOKEN is not"},
		{base("SLUICE_SMS_SUPPRESS_CODES", "21211,x"), `SLUICE_SMS_SUPPRESS_CODES must be comma-separated provider error codes (1 to 6 digits, e.g. 21211,30005) or none, got "x"`},
		{base("SLUICE_SMS_SUPPRESS_CODES", "21211,0"), `SLUICE_SMS_SUPPRESS_CODES must be comma-separated`},
		{base("SLUICE_SMS_SUPPRESS_TTL", "10m"), "SLUICE_SMS_SUPPRESS_TTL must be between 1h and 87600h"},
		{base("SLUICE_SMS_SENDER", "http", "SLUICE_SMS_ACCOUNT_SID", "AC1", "SLUICE_SMS_FROM", "+15005550006"), "SLUICE_SMS_AUTH_TOKEN must be set"},
		{base("SLUICE_EMAIL_SENDER", "smtp", "SLUICE_SMTP_FROM", "not an address"), "SLUICE_SMTP_FROM must be an email address"},
		{base("SLUICE_MAX_INLINE_WAIT", "1s"), "SLUICE_MAX_INLINE_WAIT must be 0 or at least"},
		{base("SLUICE_ORPHAN_AFTER", "5s"), "SLUICE_ORPHAN_AFTER must be 0 (off) or between 11s and 10m"},
		{base("SLUICE_REDIS_URL", "redis://localhost:notaport/0"), `SLUICE_REDIS_URL is not a URL (invalid port ":notaport" after host)`},
		{base("SLUICE_REDIS_URL", "redis://localhost:70000/0"), `SLUICE_REDIS_URL has port "70000"`},
		{base("SLUICE_REDIS_URL", "http://localhost:6379/0"), `SLUICE_REDIS_URL has scheme "http"`},
		{base("SLUICE_REDIS_URL", "redis://localhost:6379/x"), `SLUICE_REDIS_URL redis: invalid database number`},
	}
	for _, tc := range cases {
		_, err := worker.ParseConfig(tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.env, err, tc.want)
		}
	}
	if _, err := worker.ParseConfig(base("SLUICE_MAX_INLINE_WAIT", "0s")); err != nil {
		t.Errorf("inline waits off: %v", err)
	}
	// SMS over http goes from a number or through a Messaging Service.
	if _, err := worker.ParseConfig(base("SLUICE_SMS_SENDER", "http", "SLUICE_SMS_ACCOUNT_SID", "AC1", "SLUICE_SMS_AUTH_TOKEN", "t",
		"SLUICE_SMS_MESSAGING_SERVICE_SID", "MG0123456789abcdef0123456789ABCDEF", "SLUICE_SMS_STATUS_CALLBACK_URL", "https://sluice.example.com/hooks")); err != nil {
		t.Fatalf("SMS through a Messaging Service with callbacks: %v", err)
	}
	cfg, err := worker.ParseConfig(base("SLUICE_SMS_SUPPRESS_CODES", "none"))
	if err != nil {
		t.Fatal(err)
	}
	if codes := cfg.SMSSuppressCodes; codes != nil {
		t.Errorf("SLUICE_SMS_SUPPRESS_CODES=none: %v; want no codes", codes)
	}
	if cfg, err = worker.ParseConfig(base()); err != nil {
		t.Fatal(err)
	}
	if codes := cfg.SMSSuppressCodes; len(codes) != 5 || !codes[21211] || !codes[30005] || codes[30003] || codes[30007] {
		t.Errorf("default suppress codes %v", codes)
	}
}

// SLUICE_REDIS_CA_FILE and SLUICE_SMTP_CA_FILE must name a readable file
// holding at least one PEM certificate, and are refused where no TLS would
// use them.
func TestConfigCAFiles(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	dir := t.TempDir()
	noCert := filepath.Join(dir, "key-only.pem")
	if err := os.WriteFile(noCert, []byte("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	base := func(over map[string]string) map[string]string {
		env := map[string]string{
			"SLUICE_SUBJECT_SECRET": "0123456789abcdef",
			"SLUICE_PAYLOAD_KEYS":   testKeys,
			"SLUICE_REDIS_URL":      "rediss://redis.internal:6380/0",
			"SLUICE_EMAIL_SENDER":   "smtp",
			"SLUICE_SMTP_TLS":       "starttls",
		}
		maps.Copy(env, over)
		return env
	}

	cfg, err := worker.ParseConfig(base(map[string]string{"SLUICE_REDIS_CA_FILE": certs.CAFile, "SLUICE_SMTP_CA_FILE": certs.CAFile}))
	if err != nil {
		t.Fatalf("valid CA files refused: %v", err)
	}
	if cfg.RedisCAFile != certs.CAFile || smtpSettings(t, cfg).CAFile != certs.CAFile {
		t.Fatalf("CA files not read: %+v", cfg)
	}
	if _, err := worker.ParseConfig(base(nil)); err != nil {
		t.Fatalf("empty CA files (system roots) refused: %v", err)
	}

	cases := []struct {
		env  map[string]string
		want []string // all must appear in the error
	}{
		{map[string]string{"SLUICE_REDIS_CA_FILE": missing}, []string{"SLUICE_REDIS_CA_FILE", "no such file"}},
		{map[string]string{"SLUICE_REDIS_CA_FILE": noCert}, []string{"SLUICE_REDIS_CA_FILE", "holds no PEM certificate"}},
		{map[string]string{"SLUICE_REDIS_CA_FILE": dir}, []string{"SLUICE_REDIS_CA_FILE", "readable"}},
		{map[string]string{"SLUICE_REDIS_CA_FILE": certs.CAFile, "SLUICE_REDIS_URL": "redis://redis.internal:6379/0"},
			[]string{"SLUICE_REDIS_CA_FILE", "SLUICE_REDIS_URL", "rediss://"}},
		{map[string]string{"SLUICE_SMTP_CA_FILE": missing}, []string{"SLUICE_SMTP_CA_FILE", "no such file"}},
		{map[string]string{"SLUICE_SMTP_CA_FILE": noCert}, []string{"SLUICE_SMTP_CA_FILE", "holds no PEM certificate"}},
		{map[string]string{"SLUICE_SMTP_CA_FILE": certs.CAFile, "SLUICE_SMTP_TLS": "none"}, []string{"SLUICE_SMTP_CA_FILE", "SLUICE_SMTP_TLS=none"}},
	}
	for _, c := range cases {
		_, err := worker.ParseConfig(base(c.env))
		if !errors.Is(err, config.ErrConfig) {
			t.Errorf("%v: err = %v, want a config error", c.env, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not mention %q", c.env, err, w)
			}
		}
	}

	// NewRedisClient (used by tools that skip Validate) refuses them too.
	for _, env := range []map[string]string{
		{"SLUICE_REDIS_CA_FILE": noCert},
		{"SLUICE_REDIS_CA_FILE": certs.CAFile, "SLUICE_REDIS_URL": "redis://redis.internal:6379/0"},
	} {
		cfg, err := worker.ReadConfig(base(env))
		if err != nil {
			t.Fatal(err)
		}
		if c, err := cfg.NewRedisClient(); !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), "SLUICE_REDIS_CA_FILE") {
			if c != nil {
				c.Close()
			}
			t.Errorf("NewRedisClient(%v) err = %v, want a config error naming SLUICE_REDIS_CA_FILE", env, err)
		}
	}
}

// SMTP AUTH needs TLS: a username with SLUICE_SMTP_TLS=none or opportunistic
// (where the password may cross the network in clear) is refused, naming
// both variables, unless SLUICE_SMTP_ALLOW_PLAIN_AUTH=true.
func TestConfigSMTPAuthNeedsTLS(t *testing.T) {
	t.Parallel()
	parse := func(mode, user, allow string) error {
		env := map[string]string{
			"SLUICE_SUBJECT_SECRET": "0123456789abcdef",
			"SLUICE_PAYLOAD_KEYS":   testKeys,
			"SLUICE_EMAIL_SENDER":   "smtp",
			"SLUICE_SMTP_TLS":       mode,
			"SLUICE_SMTP_USERNAME":  user,
			"SLUICE_SMTP_PASSWORD":  "pw",
		}
		if allow != "" {
			env["SLUICE_SMTP_ALLOW_PLAIN_AUTH"] = allow
		}
		_, err := worker.ParseConfig(env)
		return err
	}
	for _, mode := range []string{"none", "opportunistic"} {
		err := parse(mode, "mailer", "")
		if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), "SLUICE_SMTP_USERNAME") ||
			!strings.Contains(err.Error(), "SLUICE_SMTP_TLS="+mode) || !strings.Contains(err.Error(), "SLUICE_SMTP_ALLOW_PLAIN_AUTH") {
			t.Errorf("AUTH with TLS %s: err = %v, want a config error naming SLUICE_SMTP_USERNAME, SLUICE_SMTP_TLS and the way out", mode, err)
		}
		if err := parse(mode, "mailer", "false"); err == nil {
			t.Errorf("AUTH with TLS %s and ALLOW_PLAIN_AUTH=false accepted", mode)
		}
		if err := parse(mode, "mailer", "true"); err != nil {
			t.Errorf("AUTH with TLS %s explicitly allowed: %v", mode, err)
		}
		if err := parse(mode, "", ""); err != nil {
			t.Errorf("TLS %s without AUTH: %v", mode, err)
		}
	}
	for _, mode := range []string{"starttls", "tls"} {
		if err := parse(mode, "mailer", ""); err != nil {
			t.Errorf("AUTH over TLS %s: %v", mode, err)
		}
	}
	cfg, err := worker.ParseConfig(map[string]string{"SLUICE_SUBJECT_SECRET": "0123456789abcdef", "SLUICE_PAYLOAD_KEYS": testKeys})
	if err != nil || smtpSettings(t, cfg).AllowPlainAuth {
		t.Errorf("SLUICE_SMTP_ALLOW_PLAIN_AUTH must default to false: %v, %v", smtpSettings(t, cfg).AllowPlainAuth, err)
	}
}

// A channel's provider list: each named provider reads its own variables
// (SLUICE_PROVIDER_NAME_...), a bad list or a named provider's bad setting
// is refused naming the variable, the named providers' variables are known
// (not reported as unknown) and their secrets masked.
func TestConfigProviderLists(t *testing.T) {
	t.Parallel()
	base := map[string]string{"SLUICE_SUBJECT_SECRET": "0123456789abcdef", "SLUICE_PAYLOAD_KEYS": testKeys,
		"SLUICE_SMS_SENDER": "http", "SLUICE_SMS_ACCOUNT_SID": "AC1", "SLUICE_SMS_AUTH_TOKEN": "tok-primary", "SLUICE_SMS_FROM": "+15005550006",
		"SLUICE_SMS_PROVIDERS":                   "default,backup",
		"SLUICE_PROVIDER_BACKUP_SMS_SENDER":      "http",
		"SLUICE_PROVIDER_BACKUP_SMS_BASE_URL":    "http://127.0.0.1:9",
		"SLUICE_PROVIDER_BACKUP_SMS_ACCOUNT_SID": "AC2",
		"SLUICE_PROVIDER_BACKUP_SMS_AUTH_TOKEN":  "tok-backup-secret",
	}
	cfg, err := worker.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := cfg.Providers("sms")
	if err != nil || len(specs) != 2 || specs[0].Name != "default" || specs[1].Name != "backup" || specs[1].Kind != "http" ||
		specs[1].Environ["SLUICE_SMS_BASE_URL"] != "http://127.0.0.1:9" || specs[0].Environ["SLUICE_SMS_AUTH_TOKEN"] != "tok-primary" {
		t.Fatalf("providers: %+v, %v", specs, err)
	}
	if email, err := cfg.Providers("email"); err != nil || len(email) != 1 || email[0].Name != "default" || email[0].Kind != "log" {
		t.Fatalf("email without a list: %+v, %v", email, err)
	}
	all := strings.Join(cfg.Redacted(), "\n")
	if strings.Contains(all, "tok-backup-secret") || !strings.Contains(all, "SLUICE_PROVIDER_BACKUP_SMS_BASE_URL=http://127.0.0.1:9") {
		t.Errorf("Redacted:\n%s", all)
	}
	if err := config.UnknownVariables(base, append(worker.KnownVariables(), worker.ProviderVariables(base)...)); err != nil {
		t.Errorf("a named provider's variables reported unknown: %v", err)
	}
	// A named provider's own sender settings (issue 53): known, and its
	// own in place of the deployment's; unset, the deployment's.
	own := maps.Clone(base)
	own["SLUICE_PROVIDER_BACKUP_SMS_FROM"] = "+15005550099"
	if err := config.UnknownVariables(own, append(worker.KnownVariables(), worker.ProviderVariables(own)...)); err != nil {
		t.Errorf("a named provider's own From reported unknown: %v", err)
	}
	ocfg, err := worker.ParseConfig(own)
	if err != nil {
		t.Fatal(err)
	}
	if specs, _ := ocfg.Providers("sms"); specs[1].Base.SMSFrom != "+15005550099" || specs[0].Base.SMSFrom != "+15005550006" {
		t.Errorf("the backup's From %q, the primary's %q", specs[1].Base.SMSFrom, specs[0].Base.SMSFrom)
	}
	if specs[1].Base.SMSFrom != "+15005550006" {
		t.Errorf("a backup without a From of its own: %q, want the deployment's", specs[1].Base.SMSFrom)
	}
	if all := strings.Join(ocfg.Redacted(), "\n"); !strings.Contains(all, "SLUICE_PROVIDER_BACKUP_SMS_FROM=+15005550099") {
		t.Errorf("Redacted leaves out the backup's From:\n%s", all)
	}
	unnamed := maps.Clone(base)
	unnamed["SLUICE_PROVIDER_OTHER_SMS_SENDER"] = "http"
	if err := config.UnknownVariables(unnamed, append(worker.KnownVariables(), worker.ProviderVariables(unnamed)...)); err == nil ||
		!strings.Contains(err.Error(), "SLUICE_PROVIDER_OTHER_SMS_SENDER") {
		t.Errorf("a provider no list names: %v", err)
	}
	for want, change := range map[string]map[string]string{
		"SLUICE_SMS_PROVIDERS has \"Backup\"":          {"SLUICE_SMS_PROVIDERS": "default,Backup"},
		"SLUICE_SMS_PROVIDERS names \"default\" twice": {"SLUICE_SMS_PROVIDERS": "default,default"},
		"SLUICE_PROVIDER_SPARE_SMS_SENDER must be":     {"SLUICE_SMS_PROVIDERS": "default,spare"},
		"SLUICE_PROVIDER_BACKUP_SMS_ACCOUNT_SID":       {"SLUICE_PROVIDER_BACKUP_SMS_ACCOUNT_SID": ""},
		"SLUICE_PROVIDER_FAILURES must be":             {"SLUICE_PROVIDER_FAILURES": "0"},
		"SLUICE_FAILOVER_GRACE must be":                {"SLUICE_FAILOVER_GRACE": "-1s"},
		"SLUICE_PROVIDER_BACKUP_SMS_MESSAGING_SERVICE_SID and SLUICE_PROVIDER_BACKUP_SMS_FROM are both set": {
			"SLUICE_PROVIDER_BACKUP_SMS_FROM": "+15005550099", "SLUICE_PROVIDER_BACKUP_SMS_MESSAGING_SERVICE_SID": "MG" + strings.Repeat("0", 32)},
		"SLUICE_PROVIDER_BACKUP_SMS_MESSAGING_SERVICE_SID must be MG": {"SLUICE_PROVIDER_BACKUP_SMS_MESSAGING_SERVICE_SID": "MG1"},
		"SLUICE_PROVIDER_SPARE_SMTP_FROM must be an email address": {"SLUICE_EMAIL_PROVIDERS": "default,spare", "SLUICE_PROVIDER_SPARE_EMAIL_SENDER": "log",
			"SLUICE_PROVIDER_SPARE_SMTP_FROM": "not an address"},
	} {
		env := maps.Clone(base)
		maps.Copy(env, change)
		_, err := worker.ParseConfig(env)
		if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: err = %v, want one naming %s", change, err, want)
		}
	}
}

// Every variable a named provider reads is listed in docs/configuration.md
// ("Per-provider variables"), without its prefix.
func TestProviderVariablesDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Per-provider variables\n")
	if !ok {
		t.Fatal(`docs/configuration.md has no "## Per-provider variables" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var table strings.Builder // its table's rows: the list, not the prose around it
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "|") {
			table.WriteString(line + "\n")
		}
	}
	env := map[string]string{"SLUICE_SMS_PROVIDERS": "default,x", "SLUICE_EMAIL_PROVIDERS": "default,x", "SLUICE_WHATSAPP_PROVIDERS": "default,x"}
	vars := worker.ProviderVariables(env)
	if len(vars) < 10 {
		t.Fatalf("ProviderVariables: %v", vars)
	}
	for _, v := range vars {
		name := strings.TrimPrefix(v, "SLUICE_PROVIDER_X_")
		if !strings.Contains(table.String(), "`"+name+"`") {
			t.Errorf("%s (as SLUICE_PROVIDER_NAME_%s) is not in docs/configuration.md's per-provider list", v, name)
		}
	}
}
