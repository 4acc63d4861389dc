//go:build !nodev

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

type devFlags struct {
	http         string
	sends, limit int
	window       time.Duration
	exitWhenDone bool
}

func newDevCmd() *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an embedded demo: in-process Redis, a worker, and a throttled burst",
		Long: `Run Sluice with nothing installed: an in-process Redis (miniredis), a worker
with the log sender, and the classic sliding-log demo — 8 SMS to one recipient under a
quota of 5 per 10 seconds. It shows live which sends went out, which were
denied and when they were rescheduled to, then keeps serving (with /metrics,
/healthz and /readyz) until Ctrl-C.`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.sends < 1 || f.limit < 1 || f.window < time.Millisecond {
				return usageError{fmt.Errorf("--sends, --limit and --window must be positive")}
			}
			return runDev(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	cmd.Flags().StringVar(&f.http, "http", "127.0.0.1:9090", "listen address for /metrics, /healthz, /readyz (a free port is used if it is taken)")
	cmd.Flags().IntVar(&f.sends, "sends", 8, "SMS to send to the demo recipient")
	cmd.Flags().IntVar(&f.limit, "limit", 5, "quota: sends per window per recipient")
	cmd.Flags().DurationVar(&f.window, "window", 10*time.Second, "quota window")
	cmd.Flags().BoolVar(&f.exitWhenDone, "exit-when-done", false, "exit once every demo send went out")
	return cmd
}

func runDev(ctx context.Context, out io.Writer, f devFlags) error {
	ln, err := net.Listen("tcp", f.http)
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return err
		}
	}
	rule := throttle.Rule{Limit: f.limit, Window: f.window}
	quietHours := devQuietHours()
	var cfg worker.Config
	p := &devPrinter{out: out, start: time.Now(), num: map[string]string{}, sent: make(chan string, f.sends+8)}
	dev, err := app.NewDev(func(url string) (worker.Config, app.WorkerOptions, error) {
		cfg, err = devConfig(url, rule, quietHours)
		return cfg, app.WorkerOptions{Listener: ln, Logger: cfg.NewLogger(out),
			Senders: map[tasks.Channel]sender.Sender{tasks.SMS: p, tasks.Email: p}, OnDecision: p.decision}, err
	})
	if err != nil {
		return err
	}
	defer dev.Close()
	w := dev.Worker
	p.w = w
	p.printf("sluice dev: embedded Redis (miniredis) at %s, one worker, log sender\n", dev.Embedded.Addr())
	p.printf("quota: sms:recipient %s (the classic sliding-log demo), sms:tenant 1000/1h\n", rule)
	p.printf("metrics: http://%s/metrics   health: http://%s/healthz  http://%s/readyz\n\n", ln.Addr(), ln.Addr(), ln.Addr())

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	producer := asynq.NewClientFromRedisClient(dev.Redis)
	defer producer.Close()
	act := func(err error) error { // an act cut short: by the worker's end, or its own error (then the worker stops)
		var ended workerEnded
		if errors.As(err, &ended) {
			return ended.err
		}
		stop()
		<-done
		return interrupted(ctx, err)
	}
	if err := act1Demo(ctx, p, producer, w, cfg.Layout(), f, done); err != nil {
		return act(err)
	}
	p.printf("\nall %d sent: %d at once, %d after the window freed, none failed or dropped.\n", f.sends, min(f.limit, f.sends), max(0, f.sends-f.limit))
	if err := act2Demo(ctx, p, producer, w, cfg.Layout(), quietHours, done); err != nil {
		return act(err)
	}
	if f.exitWhenDone {
		stop()
		return <-done
	}
	p.printf("serving until Ctrl-C (try: curl -s http://%s/metrics | grep sluice_)\n", ln.Addr())
	return <-done
}

// devQuietHours are act 2's quiet hours: around now for a recipient in
// Kolkata.
func devQuietHours() string {
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	local := time.Now().In(kolkata)
	return local.Add(-time.Hour).Format("15:04") + "-" + local.Add(2*time.Hour).Format("15:04")
}

// devConfig is the demo worker's configuration on the embedded Redis at
// url: act 1's sliding-log rule, and act 2's capped category, priority
// lane and quiet hours.
func devConfig(url string, rule throttle.Rule, quietHours string) (worker.Config, error) {
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	act2 := ",sms.marketing:recipient=1/1m,sms.otp:exempt,sms.otp:recipient=5/1h,sms.promo:quiet=" + quietHours
	return worker.ParseConfig(map[string]string{
		"SLUICE_REDIS_URL":      url,
		"SLUICE_SUBJECT_SECRET": hex.EncodeToString(secret),
		"SLUICE_PAYLOAD_KEYS":   tasks.NewKeySpec("dev"),
		"SLUICE_RULES":          "sms:recipient=" + rule.String() + ",sms:tenant=1000/1h,email:recipient=" + rule.String() + act2,
		"SLUICE_HTTP_ADDR":      "off",
		"SLUICE_LOG_LEVEL":      "warn",
		"SLUICE_POLL_INTERVAL":  "100ms",
		// One shard per lane; miniredis has no CLIENT TRACKING, so the
		// queue gate stays off and the few queues are polled as plain Asynq does.
		"SLUICE_QUEUE_SHARDS":  "1",
		"SLUICE_QUEUE_RECHECK": "0",
	})
}

// act1Demo enqueues f.sends SMS to one recipient 100 ms apart and waits
// until every one was sent.
func act1Demo(ctx context.Context, p *devPrinter, producer *asynq.Client, w *worker.Worker, layout tasks.Layout, f devFlags, done <-chan error) error {
	p.printf("enqueueing %d SMS to %s, 100 ms apart\n", f.sends, tasks.Mask("+14155550100"))
	for i := 1; i <= f.sends; i++ {
		n := tasks.NewSMS("demo", "+14155550100", "demo message "+strconv.Itoa(i))
		p.number(n.ID, "#"+strconv.Itoa(i))
		if _, err := tasks.Enqueue(ctx, producer, w.Keys(), n, asynq.Queue(w.Policy().Queue(layout, n))); err != nil {
			return err
		}
		if i < f.sends {
			select {
			case <-time.After(100 * time.Millisecond): // the demo's pacing
			case <-ctx.Done():
			}
		}
	}
	for sent := 0; sent < f.sends; {
		select {
		case l := <-p.sent:
			if strings.HasPrefix(l, "#") {
				sent++
			}
		case err := <-done:
			return workerEnded{err}
		}
	}
	return nil
}

// workerEnded is an act cut short by the worker's end (Ctrl-C): its Run's
// error, nil for a clean stop.
type workerEnded struct{ err error }

func (e workerEnded) Error() string { return fmt.Sprintf("the worker ended: %v", e.err) }

// interrupted is nil when err only reports the Ctrl-C that stopped the demo
// (an enqueue cut short by it), else err.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// act2Demo shows the compliance rules: an OTP goes at once while
// marketing to the same number waits for its cap, and a promo waits for the
// end of the recipient's quiet hours.
func act2Demo(ctx context.Context, p *devPrinter, producer *asynq.Client, w *worker.Worker, layout tasks.Layout, quietHours string, done <-chan error) error {
	p.printf("\nact 2: compliance rules — sms.marketing:recipient=1/1m, sms.otp:exempt (a priority lane) with its own cap 5/1h,\n")
	p.printf("       and sms.promo:quiet=%s in the recipient's local time\n", quietHours)
	p.printf("enqueueing 3 marketing SMS, then an OTP, to %s\n", tasks.Mask("+14155550200"))
	enqueue := func(n tasks.Notification, label string) error {
		p.number(n.ID, label)
		_, err := tasks.Enqueue(ctx, producer, w.Keys(), n, asynq.Queue(w.Policy().Queue(layout, n)))
		return err
	}
	for i := 1; i <= 3; i++ {
		n := tasks.NewSMS("demo", "+14155550200", "sale "+strconv.Itoa(i))
		n.Category = "marketing"
		if err := enqueue(n, "M"+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	otp := tasks.NewSMS("demo", "+14155550200", "your code is 424242")
	otp.Category = "otp"
	if err := enqueue(otp, "OTP"); err != nil {
		return err
	}
	promo := tasks.NewSMS("demo", "+919820000000", "weekend offer")
	promo.Category, promo.TZ = "promo", "Asia/Kolkata"
	p.printf("enqueueing a promo to %s (Asia/Kolkata, quiet now)\n", tasks.Mask(promo.To))
	if err := enqueue(promo, "P1"); err != nil {
		return err
	}
	want := map[string]bool{"M1": true, "OTP": true}
	for len(want) > 0 {
		select {
		case l := <-p.sent:
			delete(want, l)
		case err := <-done:
			return workerEnded{err}
		case <-ctx.Done():
			return nil
		}
	}
	p.waitBooked(ctx, "M2", "M3", "P1")
	p.printf("\nact 2 done: the OTP went at once while marketing waits for its 1/1m cap; the promo is booked for the\n")
	p.printf("end of the recipient's quiet hours, and goes then at the rules' pace.\n")
	return nil
}

// devPrinter prints the demo's timeline and is its sender.
type devPrinter struct {
	mu     sync.Mutex
	out    io.Writer
	start  time.Time
	num    map[string]string
	booked map[string]bool
	sent   chan string
	w      *worker.Worker
}

// waitBooked waits until each label's notification has been booked.
func (p *devPrinter) waitBooked(ctx context.Context, labels ...string) {
	for {
		p.mu.Lock()
		all := true
		for _, l := range labels {
			all = all && p.booked[l]
		}
		p.mu.Unlock()
		if all || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond): // decisions arrive on the worker's goroutines
		}
	}
}

func (p *devPrinter) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, format, args...)
}

func (p *devPrinter) number(id, label string) { p.mu.Lock(); p.num[id] = label; p.mu.Unlock() }

func (p *devPrinter) label(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.num[id]; ok {
		return l
	}
	return id
}

func (p *devPrinter) at() string { return fmt.Sprintf("%6.2fs", time.Since(p.start).Seconds()) }

func (p *devPrinter) decision(n tasks.Notification, d throttle.Decision) {
	switch {
	case d.Status == throttle.StatusAdmitted && d.Wait == 0:
		p.printf("  %s  %-3s ALLOWED  (%d left in the window)\n", p.at(), p.label(n.ID), d.Remaining)
	case d.Status == throttle.StatusAdmitted:
		p.printf("  %s  %-3s ALLOWED  for its slot in %.2fs: waits in the worker, sends on the millisecond\n", p.at(), p.label(n.ID), d.Wait.Seconds())
	case d.Status == throttle.StatusBooked || d.Status == throttle.StatusDenied:
		wake := p.w.WakeTime(d)
		what := "next slot opens"
		if d.Booked {
			what = "slot booked"
		}
		why := "quiet hours"
		if rates := p.w.Policy().Match(n.Tenant, n.Channel, n.Category).Rates; d.DeniedBy >= 0 && d.DeniedBy < len(rates) {
			why = rates[d.DeniedBy].String()
		}
		p.printf("  %s  %-3s DENIED   %s in %s (%s) → back in the queue until %s, not a failure\n",
			p.at(), p.label(n.ID), what, d.RetryAfter.Round(10*time.Millisecond), why, wake.Format("15:04:05"))
		p.mu.Lock()
		if p.booked == nil {
			p.booked = map[string]bool{}
		}
		p.booked[p.num[n.ID]] = true
		p.mu.Unlock()
	}
}

// Send is the demo's log sender.
func (p *devPrinter) Send(_ context.Context, n tasks.Notification) error {
	p.printf("  %s  %-3s SENT     %s to %s\n", p.at(), p.label(n.ID), n.Channel, tasks.Mask(n.To))
	select {
	case p.sent <- p.label(n.ID):
	default:
	}
	return nil
}
