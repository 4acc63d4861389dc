package throttle_test

import (
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
)

// startExampleRedis starts the private redis-server the examples use; the
// returned func stops it.
func startExampleRedis() (func(), error) {
	dir, err := os.MkdirTemp("", "sluice-example-")
	if err != nil {
		return nil, err
	}
	srv, err := redistest.Launch(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	exampleRedis = func() redis.UniversalClient { return c }
	return func() { c.Close(); srv.Stop(); os.RemoveAll(dir) }, nil
}
