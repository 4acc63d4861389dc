package worker_test

// TLS proven, not assumed: real servers on loopback (redis-server with
// --tls-port only, a TLS Redis Cluster, the fake SMTP server with STARTTLS or
// implicit TLS) and a CA made by the test. Each test shows a worker or
// sender either speaking TLS to a server it trusts, or refusing one it
// must not trust.

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/app"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/testkit/tlstest"
	"github.com/sluicehq/sluice/worker"
)

// tlsEnv is a worker configuration for an SMTP fake at smtp and a Redis URL;
// over replaces or adds variables.
func tlsEnv(redisURL string, smtp *fakes.SMTPServer, over map[string]string) map[string]string {
	env := map[string]string{
		"SLUICE_REDIS_URL":        redisURL,
		"SLUICE_SUBJECT_SECRET":   "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":     testKeys,
		"SLUICE_HTTP_ADDR":        "off",
		"SLUICE_EMAIL_SENDER":     "smtp",
		"SLUICE_SMTP_HOST":        smtp.Host,
		"SLUICE_SMTP_PORT":        strconv.Itoa(smtp.Port),
		"SLUICE_SMTP_TLS":         "none",
		"SLUICE_SHUTDOWN_TIMEOUT": "5s",
		"SLUICE_RETRY_BASE":       "1s",
		"SLUICE_POLL_INTERVAL":    "100ms",
	}
	maps.Copy(env, over)
	return env
}

// runWorker runs a worker on cfg until the test ends; the test fails if Run
// returns an error (at once, so a worker that refuses to start is reported
// before the wait for its delivery times out).
func runWorker(t *testing.T, cfg worker.Config) {
	t.Helper()
	w, err := app.NewWorker(cfg, app.WorkerOptions{Registry: prometheus.NewRegistry(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(ctx); err != nil {
			t.Errorf("worker.Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func parseConfig(t *testing.T, env map[string]string) worker.Config {
	t.Helper()
	cfg, err := worker.ParseConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A worker whose Redis speaks only TLS (rediss://, the test CA in
// SLUICE_REDIS_CA_FILE) takes a task and delivers it to an SMTP server over
// STARTTLS with AUTH, trusting the CA given in SLUICE_SMTP_CA_FILE.
func TestTLSWorkerOverRedissAndSMTPStartTLSWithAuth(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	srv := redistest.StartTLS(t, certs)
	smtp := fakes.NewSMTPServer(t, fakes.WithSTARTTLS(certs.Server.ServerConfig()), fakes.WithAuth("sluice", "s3cret"))
	runWorker(t, parseConfig(t, tlsEnv(srv.URL(), smtp, map[string]string{
		"SLUICE_REDIS_CA_FILE": certs.CAFile,
		"SLUICE_SMTP_TLS":      "starttls",
		"SLUICE_SMTP_CA_FILE":  certs.CAFile,
		"SLUICE_SMTP_USERNAME": "sluice",
		"SLUICE_SMTP_PASSWORD": "s3cret",
	})))

	client := asynq.NewClientFromRedisClient(srv.Client(t))
	n := tasks.NewEmail("acme", "tls@example.com", "Over TLS", "hello")
	if _, err := tasks.Enqueue(context.Background(), client, mustKeys(t), n); err != nil {
		t.Fatal(err)
	}
	d := smtp.WaitCount(t, 1, 15*time.Second)[0]
	if d.ID != n.ID || !d.TLS || d.AuthUser != "sluice" {
		t.Fatalf("delivery %+v: want id %s over TLS as sluice", d, n.ID)
	}
}

// The same over a 3-master Redis Cluster whose client port, cluster bus and
// replication all use TLS. REDIS_URL's host names no node: each node's
// certificate is checked against the address it is dialed at.
func TestTLSWorkerOverRedisCluster(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	certs := tlstest.New(t)
	cl, cc := redistest.NewTLSCluster(t, certs, 3, 0)
	smtp := fakes.NewSMTPServer(t)
	runWorker(t, parseConfig(t, tlsEnv("rediss://cluster-seed.invalid:6379/0", smtp, map[string]string{
		"SLUICE_REDIS_CLUSTER_ADDRS": strings.Join(cl.Addrs, ","),
		"SLUICE_REDIS_CA_FILE":       certs.CAFile,
	})))

	client := asynq.NewClientFromRedisClient(cc)
	n := tasks.NewEmail("acme", "cluster@example.com", "Over a TLS cluster", "hello")
	if _, err := tasks.Enqueue(context.Background(), client, mustKeys(t), n); err != nil {
		t.Fatal(err)
	}
	if d := smtp.WaitCount(t, 1, 15*time.Second)[0]; d.ID != n.ID {
		t.Fatalf("delivered %s, want %s", d.ID, n.ID)
	}
}

// A worker refuses to start against a Redis whose certificate it cannot
// trust: a CA that did not sign it, the system roots (which do not hold the
// test CA), or an expired certificate. Run returns an error that names the
// variables and says what is wrong with the certificate.
func TestTLSWorkerRefusesUntrustedRedis(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	good := redistest.StartTLS(t, certs)
	expired := redistest.StartTLSWith(t, certs, certs.Expired)
	cl, _ := redistest.NewTLSCluster(t, certs, 3, 0)
	smtp := fakes.NewSMTPServer(t)
	cases := []struct {
		name, want string
		env        map[string]string
	}{
		{"wrong CA", "certificate signed by unknown authority",
			map[string]string{"SLUICE_REDIS_URL": good.URL(), "SLUICE_REDIS_CA_FILE": certs.OtherCAFile}},
		{"system roots", "certificate signed by unknown authority",
			map[string]string{"SLUICE_REDIS_URL": good.URL()}},
		{"expired certificate", "certificate has expired",
			map[string]string{"SLUICE_REDIS_URL": expired.URL(), "SLUICE_REDIS_CA_FILE": certs.CAFile}},
		{"cluster, wrong CA", "certificate signed by unknown authority",
			map[string]string{"SLUICE_REDIS_URL": "rediss://cluster-seed.invalid:6379/0",
				"SLUICE_REDIS_CLUSTER_ADDRS": strings.Join(cl.Addrs, ","), "SLUICE_REDIS_CA_FILE": certs.OtherCAFile}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := parseConfig(t, tlsEnv("", smtp, c.env))
			w, err := app.NewWorker(cfg, app.WorkerOptions{Registry: prometheus.NewRegistry(), Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = w.Run(ctx)
			if err == nil {
				t.Fatal("worker started against a Redis it must not trust")
			}
			if ctx.Err() != nil {
				t.Fatalf("Run returned only when its context ended: %v", err)
			}
			for _, s := range []string{c.want, "SLUICE_REDIS_URL", "SLUICE_REDIS_CA_FILE"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// An SMTP server the worker cannot trust gets no email: the attempt fails at
// the TLS handshake (before AUTH, so the password is not sent either), the
// task waits for a retry with an error about the certificate, and the server
// records nothing.
func TestTLSWorkerRefusesUntrustedSMTP(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	b := setup(t, "email:recipient=10/1m")
	smtp := fakes.NewSMTPServer(t, fakes.WithSTARTTLS(certs.Server.ServerConfig()), fakes.WithAuth("sluice", "s3cret"))
	cfg := b.cfg
	cfg = withEnv(cfg, "SLUICE_SMTP_HOST", smtp.Host, "SLUICE_SMTP_PORT", strconv.Itoa(smtp.Port), "SLUICE_SMTP_TLS", "starttls",
		"SLUICE_SMTP_CA_FILE", certs.OtherCAFile, "SLUICE_SMTP_USERNAME", "sluice", "SLUICE_SMTP_PASSWORD", "s3cret")
	b.start(t, cfg)

	n := tasks.NewEmail("acme", "untrusted@example.com", "Must not arrive", "secret")
	b.enqueue(t, n, asynq.TaskID(n.ID))
	ti := b.waitTask(t, n.ID, 15*time.Second, func(ti *asynq.TaskInfo) bool { return ti.Retried >= 1 })
	if !strings.Contains(ti.LastErr, "certificate signed by unknown authority") {
		t.Errorf("last error %q does not say what is wrong with the certificate", ti.LastErr)
	}
	if d, a := smtp.Deliveries(), smtp.Attempts(); len(d) != 0 || a != 0 {
		t.Fatalf("untrusted server got %d deliveries, %d attempts", len(d), a)
	}
}

func sendOne(t *testing.T, cfg smtp.Config) (tasks.Notification, error) {
	t.Helper()
	s, err := smtp.NewSender(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	n := tasks.NewEmail("acme", "to@example.com", "Hello", "body")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n, s.Send(ctx, n)
}

// The SMTP sender delivers over STARTTLS and over implicit TLS, with AUTH
// PLAIN or LOGIN, trusting the CA file; the server sees TLS and the user.
func TestTLSSMTPSender(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	cases := []struct {
		name      string
		mode      string // SMTPConfig.TLS
		mechs     []string
		allow     bool // AllowPlainAuth
		wantTLS   bool
		implicit  bool
		offerTLS  bool
		wantError string
	}{
		{name: "STARTTLS, AUTH PLAIN", mode: "starttls", mechs: []string{"PLAIN"}, offerTLS: true, wantTLS: true},
		{name: "STARTTLS, AUTH LOGIN", mode: "starttls", mechs: []string{"LOGIN"}, offerTLS: true, wantTLS: true},
		{name: "implicit TLS, AUTH PLAIN", mode: "tls", mechs: []string{"PLAIN"}, implicit: true, wantTLS: true},
		{name: "implicit TLS, AUTH LOGIN", mode: "tls", mechs: []string{"LOGIN"}, implicit: true, wantTLS: true},
		{name: "opportunistic takes STARTTLS when offered", mode: "opportunistic", mechs: []string{"PLAIN", "LOGIN"}, offerTLS: true, wantTLS: true},
		{name: "no TLS, plain AUTH explicitly allowed", mode: "none", mechs: []string{"PLAIN"}, allow: true},
		{name: "no TLS, plain AUTH not allowed", mode: "none", mechs: []string{"PLAIN", "LOGIN"}, wantError: "not able to detect a supported authentication mechanism"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			opts := []fakes.SMTPOption{fakes.WithAuth("sluice", "s3cret", c.mechs...)}
			if c.offerTLS {
				opts = append(opts, fakes.WithSTARTTLS(certs.Server.ServerConfig()))
			}
			if c.implicit {
				opts = append(opts, fakes.WithImplicitTLS(certs.Server.ServerConfig()))
			}
			srv := fakes.NewSMTPServer(t, opts...)
			cfg := smtp.Config{Host: srv.Host, Port: srv.Port, TLS: c.mode, Username: "sluice", Password: "s3cret",
				AllowPlainAuth: c.allow, From: "sluice@example.com"}
			if c.mode != "none" {
				cfg.CAFile = certs.CAFile
			}
			n, err := sendOne(t, cfg)
			if c.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantError) {
					t.Fatalf("err = %v, want one containing %q", err, c.wantError)
				}
				if len(srv.Deliveries()) != 0 {
					t.Fatal("delivered anyway")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			d := srv.Deliveries()
			if len(d) != 1 || d[0].ID != n.ID || d[0].TLS != c.wantTLS || d[0].AuthUser != "sluice" {
				t.Fatalf("deliveries %+v: want %s with TLS=%v as sluice", d, n.ID, c.wantTLS)
			}
		})
	}
}

// The fake really checks AUTH: a wrong password is refused and a sender
// without credentials cannot send, so the AuthUser the tests above see is
// earned.
func TestTLSSMTPFakeEnforcesAuth(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	srv := fakes.NewSMTPServer(t, fakes.WithImplicitTLS(certs.Server.ServerConfig()), fakes.WithAuth("sluice", "s3cret"))
	base := smtp.Config{Host: srv.Host, Port: srv.Port, TLS: "tls", CAFile: certs.CAFile, From: "sluice@example.com"}
	wrong := base
	wrong.Username, wrong.Password = "sluice", "guess"
	if _, err := sendOne(t, wrong); err == nil || !strings.Contains(err.Error(), "535") {
		t.Errorf("wrong password: err = %v, want a 535 refusal", err)
	}
	if _, err := sendOne(t, base); err == nil || !strings.Contains(err.Error(), "530") {
		t.Errorf("no AUTH: err = %v, want a 530 refusal", err)
	}
	if d := srv.Deliveries(); len(d) != 0 {
		t.Fatalf("delivered without valid AUTH: %+v", d)
	}
}

// The SMTP sender refuses a server it cannot trust, over STARTTLS and over
// implicit TLS: a CA that did not sign its certificate, the system roots, an
// expired certificate; and with STARTTLS required it does not fall back to
// plain text when the server does not offer it. Nothing is delivered and the
// error says why.
func TestTLSSMTPSenderFailsClosed(t *testing.T) {
	t.Parallel()
	certs := tlstest.New(t)
	cases := []struct {
		name, mode, caFile, want string
		pair                     tlstest.KeyPair
		noTLS                    bool // server offers no STARTTLS
	}{
		{"STARTTLS, wrong CA", "starttls", certs.OtherCAFile, "certificate signed by unknown authority", certs.Server, false},
		{"STARTTLS, system roots", "starttls", "", "certificate signed by unknown authority", certs.Server, false},
		{"STARTTLS, expired certificate", "starttls", certs.CAFile, "certificate has expired", certs.Expired, false},
		{"implicit TLS, wrong CA", "tls", certs.OtherCAFile, "certificate signed by unknown authority", certs.Server, false},
		{"implicit TLS, system roots", "tls", "", "certificate signed by unknown authority", certs.Server, false},
		{"implicit TLS, expired certificate", "tls", certs.CAFile, "certificate has expired", certs.Expired, false},
		{"STARTTLS required, not offered", "starttls", certs.CAFile, "does not support STARTTLS", certs.Server, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			opts := []fakes.SMTPOption{fakes.WithAuth("sluice", "s3cret")}
			switch {
			case c.noTLS:
			case c.mode == "tls":
				opts = append(opts, fakes.WithImplicitTLS(c.pair.ServerConfig()))
			default:
				opts = append(opts, fakes.WithSTARTTLS(c.pair.ServerConfig()))
			}
			srv := fakes.NewSMTPServer(t, opts...)
			_, err := sendOne(t, smtp.Config{Host: srv.Host, Port: srv.Port, TLS: c.mode, CAFile: c.caFile,
				Username: "sluice", Password: "s3cret", From: "sluice@example.com"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
			var se *sender.SendError
			if !errors.As(err, &se) || !se.NotSent {
				t.Errorf("err = %#v, want a SendError marked NotSent", err)
			}
			if d, a := srv.Deliveries(), srv.Attempts(); len(d) != 0 || a != 0 {
				t.Fatalf("server got %d deliveries, %d attempts", len(d), a)
			}
		})
	}
}
