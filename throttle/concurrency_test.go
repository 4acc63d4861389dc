package throttle_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// The helper process: the test binary re-executed with SLUICE_HAMMER set
// hammers one check from its own OS process and prints how many it admitted.
func TestMain(m *testing.M) {
	if spec := os.Getenv("SLUICE_HAMMER"); spec != "" {
		os.Exit(hammerProcess(spec))
	}
	stop, err := startExampleRedis()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// hammerProcess serves trials: spec is addr|goroutines|callsPerGoroutine;
// for each group read from stdin it hammers that group and prints how many
// it admitted.
func hammerProcess(spec string) int {
	p := strings.Split(spec, "|")
	if len(p) != 3 {
		fmt.Fprintln(os.Stderr, "bad SLUICE_HAMMER spec")
		return 2
	}
	g, _ := strconv.Atoi(p[1])
	n, _ := strconv.Atoi(p[2])
	c := redis.NewClient(&redis.Options{Addr: p[0], PoolSize: g})
	defer c.Close()
	l, err := throttle.New(c, throttle.Options{Secret: testSecret})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		admitted, err := hammer(context.Background(), l, in.Text(), g, n, hammerLimits())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(admitted)
	}
	return 0
}

func hammerLimits() []throttle.Limit {
	return []throttle.Limit{{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 100, Window: time.Hour}}}
}

// hammer runs g goroutines making n checks each with distinct members and
// returns how many were admitted.
func hammer(ctx context.Context, l *throttle.Limiter, group string, g, n int, limits []throttle.Limit) (int64, error) {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, g)
	start := make(chan struct{})
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := 0; j < n; j++ {
				d, err := l.Allow(ctx, group, uuid.NewString(), limits...)
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	return admitted.Load(), <-errs
}

// ≥ 64 goroutines here and 2 more OS processes of 32 goroutines each hammer
// one key (limit 100) in each of 20 trials: exactly 100 are admitted.
func TestExactUnderConcurrencyAcrossProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	var children []child
	for p := 0; p < 2; p++ {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "SLUICE_HAMMER="+b.server.Addr+"|32|4")
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, child{cmd, in, bufio.NewScanner(out)})
	}
	defer func() {
		for _, c := range children {
			c.in.Close()
			if err := c.cmd.Wait(); err != nil {
				t.Errorf("child: %v", err)
			}
		}
	}()
	const trials = 20
	for trial := 0; trial < trials; trial++ {
		group := fmt.Sprintf("%s-%d", b.group, trial)
		for _, c := range children {
			fmt.Fprintln(c.in, group)
		}
		local, err := hammer(ctx, b.lim, group, 64, 3, hammerLimits())
		if err != nil {
			t.Fatal(err)
		}
		total := local
		for i, c := range children {
			if !c.out.Scan() {
				t.Fatalf("trial %d: child %d printed nothing", trial, i)
			}
			n, err := strconv.ParseInt(c.out.Text(), 10, 64)
			if err != nil {
				t.Fatalf("trial %d: child %d printed %q", trial, i, c.out.Text())
			}
			total += n
		}
		// 64×3 + 2×32×4 = 448 attempts for 100 slots.
		if total != 100 {
			t.Fatalf("trial %d: admitted %d (here %d), want exactly 100", trial, total, local)
		}
		key, _ := b.lim.Key(group, hammerLimits()[0])
		if n := b.client.ZCard(ctx, key).Val(); n != 100 {
			t.Fatalf("trial %d: set holds %d, want 100", trial, n)
		}
	}
}

// A three-rule check under concurrent load never exceeds any of its rules,
// and a rule shared by several recipients counts them all.
func TestMultiRuleExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	for trial := 0; trial < 10; trial++ {
		group := fmt.Sprintf("%s-%d", b.group, trial)
		tenant := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 50, Window: time.Hour}}
		var wg sync.WaitGroup
		perRcpt := make([]atomic.Int64, 8)
		errs := make(chan error, 64)
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := g % 8
				limits := []throttle.Limit{
					{Scope: "sms:recipient", Subject: fmt.Sprintf("+1415555%04d", r), Rule: throttle.Rule{Limit: 3, Window: time.Minute}},
					{Scope: "sms:recipient", Subject: fmt.Sprintf("+1415555%04d", r), Rule: throttle.Rule{Limit: 10, Window: 24 * time.Hour}},
					tenant,
				}
				for j := 0; j < 5; j++ {
					d, err := b.lim.Allow(ctx, group, uuid.NewString(), limits...)
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						perRcpt[r].Add(1)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		var sum int64
		for r := range perRcpt {
			n := perRcpt[r].Load()
			if n != 3 { // 8 goroutines × 5 calls per recipient, 3/min each; tenant 50 ≥ 8×3
				t.Fatalf("trial %d: recipient %d admitted %d, want exactly 3", trial, r, n)
			}
			sum += n
		}
		u, err := b.lim.Usage(ctx, group, 0, tenant)
		if err != nil || int64(u[0].Used) != sum {
			t.Fatalf("trial %d: tenant window holds %d, recipients admitted %d (%v)", trial, u[0].Used, sum, err)
		}
	}
	// Now the tenant rule binds: 20 recipients × 3 = 60 wanted, 50 allowed.
	group := b.group + "-tenant"
	tenant := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 50, Window: time.Hour}}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 80; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := throttle.Limit{Scope: "sms:recipient", Subject: fmt.Sprintf("+1415556%04d", g%20), Rule: throttle.Rule{Limit: 3, Window: time.Minute}}
			for j := 0; j < 3; j++ {
				if d, err := b.lim.Allow(ctx, group, uuid.NewString(), rc, tenant); err == nil && d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 50 {
		t.Fatalf("tenant rule 50/h admitted %d", admitted.Load())
	}
}
