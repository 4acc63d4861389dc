//go:build !nodev

package app

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/worker"
)

// Dev is the process `sluice dev` runs: an embedded Redis (miniredis,
// its keys expiring on the wall clock as Redis's do) and one worker on it.
// The production build (tag nodev) leaves it out, and miniredis with it.
type Dev struct {
	Embedded *miniredis.Miniredis
	Redis    *redis.Client
	Worker   *worker.Worker
}

// NewDev starts the embedded Redis, gets the worker's configuration and
// options for its address from config, and builds the worker (its Redis
// is the embedded one; miniredis has no settings to check and never
// evicts). Close it after the worker's Run.
func NewDev(config func(redisURL string) (worker.Config, WorkerOptions, error)) (*Dev, error) {
	d := &Dev{Embedded: miniredis.NewMiniRedis()}
	d.Embedded.ClockTTL(true)
	if err := d.Embedded.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start embedded redis: %w", err)
	}
	d.Redis = redis.NewClient(&redis.Options{Addr: d.Embedded.Addr()})
	cfg, o, err := config("redis://" + d.Embedded.Addr())
	if err == nil {
		o.Redis, o.NoRedisChecks = d.Redis, true
		d.Worker, err = NewWorker(cfg, o)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Close stops the embedded Redis and its client.
func (d *Dev) Close() {
	_ = d.Redis.Close()
	d.Embedded.Close()
}
