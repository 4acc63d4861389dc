package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"slices"
	"time"

	"github.com/sluicehq/sluice/services"

	"github.com/hibiken/asynq"
	"github.com/mattn/go-isatty"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

type enqueueFlags struct {
	tenant, to, from, id string
	subject, body, text  string
	category, unsub      string
	user                 string
	template, lang       string
	params               []string
	in                   time.Duration
	maxRetry             int
	file                 string
	continueOnError      bool
}

func newEnqueueCmd() *cobra.Command {
	var f enqueueFlags
	cmd := &cobra.Command{
		Use:   "enqueue {email|sms|whatsapp} [flags] | enqueue --file notifications.jsonl",
		Short: "Enqueue one notification, or a JSON Lines file of them",
		Long: `Enqueue one notification (sluice enqueue email|sms|whatsapp ...) or a JSON Lines file,
one notification per line with the payload's fields:

  {"id":"optional-stable-id","tenant":"acme","channel":"sms","to":"+14155550100","body":"Hi"}

Every line is checked before anything is enqueued: with a bad line nothing is
enqueued, its line number is printed and the exit code is 1, unless
--continue-on-error enqueues the good lines (exit code 3 when some lines were
rejected). Give ids to make a re-run safe:
ids already enqueued are reported as duplicates, never sent twice.

Bulk mail (a category the rules mark email[.CATEGORY]:bulk, in SLUICE_RULES
or the tenant's plan) needs a List-Unsubscribe, its own or an unsubscribe=
default: without one it is refused here and nothing is enqueued.

Redis and the queue come from SLUICE_REDIS_URL and SLUICE_QUEUE.`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.file == "" {
				return usageError{errors.New("enqueue needs a channel (email, sms or whatsapp) or --file")}
			}
			return enqueueFile(cmd, f)
		},
	}
	cmd.Flags().StringVar(&f.file, "file", "", "JSON Lines file of notifications ('-' for standard input)")
	cmd.Flags().BoolVar(&f.continueOnError, "continue-on-error", false, "enqueue the good lines of a file with bad ones")

	one := func(ch tasks.Channel, short string) *cobra.Command {
		c := &cobra.Command{
			Use:   string(ch),
			Short: short,
			Args:  argsError(cobra.NoArgs),
			RunE: func(cmd *cobra.Command, _ []string) error {
				return enqueueOne(cmd, ch, f)
			},
		}
		fl := c.Flags()
		fl.StringVar(&f.tenant, "tenant", "", "tenant id (required)")
		fl.StringVar(&f.to, "to", "", "recipient: an address (email) or E.164 number (sms) (required)")
		fl.StringVar(&f.from, "from", "", "sender, overriding the worker's default")
		fl.StringVar(&f.id, "id", "", "notification id (default: a new UUIDv7); the same id is never enqueued twice")
		fl.DurationVar(&f.in, "in", 0, "send no earlier than this from now, e.g. 10m")
		fl.IntVar(&f.maxRetry, "max-retry", tasks.DefaultMaxRetry, "retries for provider failures (throttling never spends them)")
		fl.StringVar(&f.category, "category", "", "category (otp, marketing, ...): rules can target it")
		fl.StringVar(&f.user, "user", "", "your id for the person, whatever the channel: user rules (*.marketing:user=3/1d) count it")
		if ch == tasks.Email {
			fl.StringVar(&f.subject, "subject", "", "subject (required)")
			fl.StringVar(&f.body, "body", "", "text body (required)")
			fl.StringVar(&f.unsub, "list-unsubscribe", "", "List-Unsubscribe: an https URL and/or a mailto: URI, comma-separated (required for bulk mail without an unsubscribe= default)")
		} else if ch == tasks.WhatsApp {
			fl.StringVar(&f.template, "template", "", "an approved template's name (a template message; without it --text is a free-form message, delivered only inside the customer-service window)")
			fl.StringVar(&f.lang, "lang", "", "the template's language code (default en_US)")
			fl.StringArrayVar(&f.params, "param", nil, "the template body's next parameter ({{1}}, {{2}}, ...); repeat it")
			fl.StringVar(&f.text, "text", "", "free-form text (instead of --template)")
		} else {
			fl.StringVar(&f.text, "text", "", "message text (required)")
		}
		return c
	}
	cmd.AddCommand(one(tasks.Email, "Enqueue one email"), one(tasks.SMS, "Enqueue one SMS"), one(tasks.WhatsApp, "Enqueue one WhatsApp message"))
	return cmd
}

// prod is what enqueueing needs from the environment.
type prod struct {
	deps     *services.Set
	client   *asynq.Client
	rdb      redis.UniversalClient
	layout   tasks.Layout
	policy   plans.Policy   // SLUICE_RULES with the tenant plans in Redis: routes each notification
	keys     *tasks.Keyring // nil: plain payloads (SLUICE_PAYLOAD_PLAINTEXT=accept)
	producer *tasks.Producer
}

// producer returns an Asynq client, the queue layout, the rules in force
// and the payload keys from the environment.
func producer(ctx context.Context) (*prod, error) {
	d, cfg, err := openTool(false)
	if err != nil {
		return nil, fmt.Errorf("%w (SLUICE_QUEUE, SLUICE_QUEUE_SHARDS, SLUICE_RULES, SLUICE_REDIS_URL)", err)
	}
	keys, err := payloadKeys(cfg)
	if err != nil {
		d.Close()
		return nil, err
	}
	// The tenants' plans decide lanes and pinned shards as they do for the
	// workers. Routing by less (a plan that does not load) is safe: a
	// worker moves a task it finds in another queue than its route.
	policy, err := d.LoadPlans(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice: routing without some tenant plans: %v\n", err)
		if len(policy.Entries()) == 0 {
			policy = d.Plans.Defaults()
		}
	}
	return &prod{deps: d, client: asynq.NewClientFromRedisClient(d.Redis), rdb: d.Redis, layout: cfg.Layout(), policy: policy, keys: keys,
		producer: tasks.NewProducer(d.Redis, keys)}, nil
}

// queue is where n goes: its lane's shard under the rules in force.
func (p *prod) queue(n tasks.Notification) string { return p.policy.Queue(p.layout, n) }

// payloadKeys are the keys that seal what a producer enqueues.
func payloadKeys(cfg config.Base) (*tasks.Keyring, error) {
	if cfg.PayloadKeys == "" && cfg.PayloadPlaintext == "accept" {
		return nil, nil
	}
	keys, err := tasks.ParseKeyring(cfg.PayloadKeys)
	if err != nil {
		return nil, fmt.Errorf("SLUICE_PAYLOAD_KEYS (workers refuse unsealed payloads; see sluice keygen): %w", err)
	}
	return keys, nil
}

func enqueueOne(cmd *cobra.Command, ch tasks.Channel, f enqueueFlags) error {
	for name, v := range map[string]string{"--tenant": f.tenant, "--to": f.to} {
		if v == "" {
			return usageError{fmt.Errorf("%s is required", name)}
		}
	}
	n := tasks.Notification{ID: f.id, Tenant: f.tenant, Channel: ch, To: f.to, From: f.from, Category: f.category, User: f.user}
	switch {
	case ch == tasks.Email:
		n.Subject, n.Body, n.ListUnsubscribe = f.subject, f.body, f.unsub
	case ch == tasks.WhatsApp && f.template != "":
		n.Template = &tasks.Template{Name: f.template, Language: f.lang, Params: f.params}
		n.Body = f.text // refused by Validate when set: a template is the whole message
	default:
		n.Body = f.text
	}
	if n.ID == "" {
		n.ID = tasks.NewID()
	}
	if err := n.Normalized().Validate(); err != nil {
		return err // checked before connecting: bad input needs no Redis
	}
	p, err := producer(cmd.Context())
	if err != nil {
		return err
	}
	defer p.deps.Close()
	if err := p.policy.Match(n.Tenant, n.Channel, n.Category).CheckNotification(n); err != nil {
		return fmt.Errorf("%w (nothing enqueued)", err)
	}
	opts := []asynq.Option{asynq.Queue(p.queue(n.Normalized())), asynq.MaxRetry(f.maxRetry)}
	if f.in > 0 {
		opts = append(opts, asynq.ProcessIn(f.in))
	}
	info, err := p.deps.Queued.Enqueue(cmd.Context(), p.client, p.keys, n, opts...)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "enqueued notification %s (task %s, queue %s)\n", n.ID, info.ID, info.Queue)
	return nil
}

func enqueueFile(cmd *cobra.Command, f enqueueFlags) error {
	var in io.Reader = cmd.InOrStdin()
	if f.file != "-" {
		fh, err := os.Open(f.file)
		if err != nil {
			return err
		}
		defer fh.Close()
		in = fh
	}
	good, bad, err := tasks.ReadBatch(in)
	if err != nil {
		return fmt.Errorf("%s: %w (nothing enqueued)", f.file, err)
	}
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	p, err := producer(cmd.Context())
	if err != nil {
		return err
	}
	defer p.deps.Close()
	// Ids already in Redis, and bulk mail without a List-Unsubscribe, are bad
	// lines too: find them before enqueueing anything.
	good, bad, err = p.checkLines(cmd.Context(), good, bad)
	if err != nil {
		return err
	}
	slices.SortStableFunc(bad, func(a, b tasks.LineError) int { return a.Line - b.Line })
	for _, e := range bad {
		fmt.Fprintf(errOut, "%s: %v\n", f.file, e)
	}
	if len(bad) > 0 && !f.continueOnError {
		fmt.Fprintf(out, "accepted 0, rejected %d of %d lines: nothing enqueued (fix the lines above, or use --continue-on-error)\n", len(bad), len(bad)+len(good))
		return fmt.Errorf("%d bad lines", len(bad))
	}
	progress := newProgress(errOut, len(good))
	accepted := 0
	for rc := range p.reserveAhead(cmd.Context(), good) {
		chunk, err := rc.chunk, rc.err
		var dups []tasks.LineError
		if err == nil { // else its caps did not take it: nothing of it went
			var n int
			n, dups, err = p.enqueueChunk(cmd.Context(), rc)
			accepted += n
		}
		for _, d := range dups {
			if !f.continueOnError {
				err = errors.Join(err, d.Err)
				continue
			}
			bad = append(bad, d)
			fmt.Fprintf(errOut, "%s: %v\n", f.file, d)
		}
		if err != nil {
			fmt.Fprintf(out, "accepted %d, stopped in lines %d-%d: %v\n", accepted, chunk[0].Line, chunk[len(chunk)-1].Line, err)
			return fmt.Errorf("enqueue stopped in lines %d-%d after %d enqueued (re-running is safe for lines with ids): %w", chunk[0].Line, chunk[len(chunk)-1].Line, accepted, err)
		}
		progress.add(len(chunk) - len(dups))
	}
	progress.done()
	fmt.Fprintf(out, "accepted %d, rejected %d\n", accepted, len(bad))
	if len(bad) > 0 {
		return partialError{fmt.Errorf("%d bad lines; the %d good ones are enqueued", len(bad), accepted)}
	}
	return nil
}

// checkLines moves to bad the lines of good that cannot go: bulk mail
// without a List-Unsubscribe, and ids already enqueued — in any queue the
// tenant's notifications may be in, read in one pipeline per 500 lines,
// four of them at a time. Good lines keep their order; bad ones come in
// no particular order.
func (p *prod) checkLines(ctx context.Context, good []tasks.BatchLine, bad []tasks.LineError) ([]tasks.BatchLine, []tasks.LineError, error) {
	chunks := slices.Collect(slices.Chunk(good, tasks.MaxRoomBatch))
	kept := make([][]tasks.BatchLine, len(chunks))
	rejected := make([][]tasks.LineError, len(chunks))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i, chunk := range chunks {
		g.Go(func() error {
			var err error
			kept[i], rejected[i], err = p.checkChunk(gctx, chunk)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return slices.Concat(kept...), append(bad, slices.Concat(rejected...)...), nil
}

// checkChunk is checkLines of up to tasks.MaxRoomBatch lines.
func (p *prod) checkChunk(ctx context.Context, chunk []tasks.BatchLine) ([]tasks.BatchLine, []tasks.LineError, error) {
	enqueued, err := p.enqueuedLines(ctx, chunk)
	if err != nil {
		return nil, nil, fmt.Errorf("check lines %d-%d: %w (nothing enqueued)", chunk[0].Line, chunk[len(chunk)-1].Line, err)
	}
	matches := map[routeKey]plans.Match{}
	kept := make([]tasks.BatchLine, 0, len(chunk))
	var bad []tasks.LineError
	for i, g := range chunk {
		n := g.Notification
		k := routeOf(n)
		m, ok := matches[k]
		if !ok {
			m = p.policy.Match(n.Tenant, n.Channel, n.Category)
			matches[k] = m
		}
		if err := m.CheckNotification(n); err != nil {
			bad = append(bad, tasks.LineError{Line: g.Line, Err: err})
			continue
		}
		if enqueued[i] {
			bad = append(bad, tasks.LineError{Line: g.Line, Err: fmt.Errorf("%w: %s is already enqueued", tasks.ErrDuplicate, n.ID)})
			continue
		}
		kept = append(kept, g)
	}
	return kept, bad, nil
}

// enqueuedLines says which of chunk's ids are enqueued already, in any
// queue the tenant's notifications may be in. It asks one EXISTS per
// queue, naming all the chunk's task keys there (one slot: a queue's keys
// share its hash tag); only a queue that holds some of them is asked
// again, key by key.
func (p *prod) enqueuedLines(ctx context.Context, chunk []tasks.BatchLine) (map[int]bool, error) {
	var queues []string
	lines := map[string][]int{} // by queue: the chunk's lines that may be in it
	cands := map[string][]string{}
	for i, g := range chunk {
		t := g.Notification.Tenant
		qs, ok := cands[t]
		if !ok {
			qs = p.layout.Candidates(t, p.policy.Pins())
			cands[t] = qs
		}
		for _, q := range qs {
			if _, ok := lines[q]; !ok {
				queues = append(queues, q)
			}
			lines[q] = append(lines[q], i)
		}
	}
	taskKeys := func(q string) []string {
		r, keys := tasks.RoomOf(q), make([]string, len(lines[q]))
		for j, i := range lines[q] {
			keys[j] = r.Task(chunk[i].Notification.ID)
		}
		return keys
	}
	counts := make([]*redis.IntCmd, len(queues))
	if _, err := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for k, q := range queues {
			counts[k] = pipe.Exists(ctx, taskKeys(q)...)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var one []*redis.IntCmd
	var oneLine []int
	if _, err := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for k, q := range queues {
			if counts[k].Val() > 0 {
				for j, key := range taskKeys(q) {
					one, oneLine = append(one, pipe.Exists(ctx, key)), append(oneLine, lines[q][j])
				}
			}
		}
		return nil
	}); err != nil && len(one) > 0 {
		return nil, err
	}
	enqueued := map[int]bool{}
	for j, c := range one {
		if c.Val() > 0 {
			enqueued[oneLine[j]] = true
		}
	}
	return enqueued, nil
}

// reservedChunk is up to tasks.MaxRoomBatch lines whose tenants' queued
// work caps are entered (err nil), or could not be (err: nothing of it
// is entered, and no chunk after it comes).
type reservedChunk struct {
	chunk []tasks.BatchLine
	batch *tasks.Prepared // its items, ready to send
	err   error
}

// reserveAhead yields good's chunks in order, each with its tenants' caps
// entered and its items prepared (sealed and encoded), one chunk ahead of
// the caller: the next chunk's caps are entered and its items prepared
// while the caller sends this one, so the client's work and Redis's
// overlap. When the caller stops early (or a chunk's caps are full), the
// chunks reserved ahead are taken out of the caps again.
func (p *prod) reserveAhead(ctx context.Context, good []tasks.BatchLine) iter.Seq[reservedChunk] {
	return func(yield func(reservedChunk) bool) {
		ahead := make(chan reservedChunk) // unbuffered: one chunk reserved ahead at most
		done := make(chan struct{})
		go func() {
			defer close(ahead)
			for chunk := range slices.Chunk(good, tasks.MaxRoomBatch) {
				select {
				case <-done:
					return
				default:
				}
				rc := reservedChunk{chunk: chunk, err: p.deps.Queued.ReserveTenants(ctx, byTenant(chunk)...)}
				if rc.err == nil {
					rc.batch = p.prepareChunk(ctx, chunk)
				}
				select {
				case ahead <- rc:
				case <-done:
					if rc.err == nil {
						p.releaseChunk(ctx, chunk)
					}
					return
				}
				if rc.err != nil {
					return
				}
			}
		}()
		defer func() {
			close(done)
			for rc := range ahead { // until the reserver ends: nothing more is entered
				if rc.err == nil {
					p.releaseChunk(ctx, rc.chunk)
				}
			}
		}()
		for rc := range ahead {
			if !yield(rc) || rc.err != nil {
				return
			}
		}
	}
}

// byTenant groups chunk's notifications by tenant, in order of first line.
func byTenant(chunk []tasks.BatchLine) [][]tasks.Notification {
	var order []string
	by := map[string][]tasks.Notification{}
	for _, g := range chunk {
		n := g.Notification
		if _, ok := by[n.Tenant]; !ok {
			order = append(order, n.Tenant)
		}
		by[n.Tenant] = append(by[n.Tenant], n)
	}
	groups := make([][]tasks.Notification, len(order))
	for i, t := range order {
		groups[i] = by[t]
	}
	return groups
}

// releaseChunk takes a reserved chunk that was not enqueued out of its
// tenants' caps (else its entries lapse after the caps' TTL).
func (p *prod) releaseChunk(ctx context.Context, chunk []tasks.BatchLine) {
	for _, ns := range byTenant(chunk) {
		ids := make([]string, len(ns))
		for i, n := range ns {
			ids[i] = n.ID
		}
		_, _ = p.deps.Queued.Release(context.WithoutCancel(ctx), ns[0].Tenant, ids...)
	}
}

// prepareChunk routes a chunk's notifications to their queues and
// prepares them (tasks.Producer.Prepare).
func (p *prod) prepareChunk(ctx context.Context, chunk []tasks.BatchLine) *tasks.Prepared {
	queues := map[routeKey]string{}
	items := make([]tasks.Item, len(chunk))
	for i, g := range chunk {
		n := g.Notification
		k := routeOf(n)
		q, ok := queues[k]
		if !ok {
			q = p.queue(n.Normalized())
			queues[k] = q
		}
		items[i] = tasks.Item{N: n, Opts: []asynq.Option{asynq.Queue(q)}}
	}
	return p.producer.Prepare(ctx, items)
}

// enqueueChunk sends a reserved chunk into its tenants' rooms, every line
// in one round trip (tasks.Producer.Send). It returns how many went, and
// the lines found enqueued meanwhile (a race with another producer),
// taken out of the caps again, as is every line that did not go.
func (p *prod) enqueueChunk(ctx context.Context, rc reservedChunk) (int, []tasks.LineError, error) {
	chunk := rc.chunk
	res, err := p.producer.Send(ctx, rc.batch)
	if res == nil && err != nil {
		p.releaseChunk(ctx, chunk)
		return 0, nil, err
	}
	var dups []tasks.LineError
	accepted := 0
	for i, r := range res {
		switch {
		case r.Err == nil:
			accepted++
		case errors.Is(r.Err, tasks.ErrDuplicate):
			dups = append(dups, tasks.LineError{Line: chunk[i].Line, Err: r.Err})
		}
		if r.Err != nil && !errors.Is(r.Err, tasks.ErrDuplicate) || err != nil && r.Info == nil {
			_, _ = p.deps.Queued.Release(context.WithoutCancel(ctx), chunk[i].Notification.Tenant, chunk[i].Notification.ID) // else it lapses after TTL
		}
	}
	return accepted, dups, err
}

// progress shows a bar on a terminal and plain counts elsewhere.
type progress struct {
	bar   *progressbar.ProgressBar
	w     io.Writer
	n, of int
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, of: total}
	if fh, ok := w.(*os.File); ok && isatty.IsTerminal(fh.Fd()) {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription("enqueueing"),
			progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
	}
	return p
}

func (p *progress) add(k int) {
	before := p.n
	p.n += k
	if p.bar != nil {
		_ = p.bar.Add(k)
	} else if p.n/1000 > before/1000 {
		fmt.Fprintf(p.w, "enqueued %d/%d\n", p.n, p.of)
	}
}

func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

// routeKey is what the rules' match of a notification, and so its queue,
// depend on: a chunk asks the policy once per key, not once per line
// (Match reads every rule).
type routeKey struct {
	tenant, category string
	channel          tasks.Channel
}

func routeOf(n tasks.Notification) routeKey {
	return routeKey{tenant: n.Tenant, category: n.Category, channel: n.Channel}
}
