package worker_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// redisClients counts the connections the test's redis-server holds.
func (b *bundle) redisClients(t *testing.T) int {
	t.Helper()
	list, err := b.rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(list, "\n")
}

// A worker that cannot listen on SLUICE_HTTP_ADDR returns the error and
// closes what New opened: its Redis connections (limiter, queues, plan
// watch) are gone, not left to the process's exit.
func TestListenFailureClosesEverything(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	before := b.redisClients(t)
	cfg := b.cfg
	cfg.HTTPAddr = busy.Addr().String()
	w, err := app.NewWorker(cfg, app.WorkerOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = w.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "SLUICE_HTTP_ADDR") {
		t.Fatalf("Run = %v, want the listen error naming SLUICE_HTTP_ADDR", err)
	}
	// Redis drops a closed connection from CLIENT LIST as it reads the
	// close; it signals nothing, so poll.
	sluicetest.EventuallyValue(t, 5*time.Second, fmt.Sprintf("redis-server to hold at most the %d connections it held before New "+
		"(more after Run returned: the worker left its clients open)", before), func() (int, bool) {
		n := b.redisClients(t)
		return n, n <= before
	})
}
