package api_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/throttle"
)

// testKeys is a payload key spec for the configuration tests.
var testKeys = tasks.NewKeySpec("apitest")

const (
	adminToken = apienv.AdminToken
	tokenKey   = apienv.TokenKey
)

// bundle is the API process on its own redis-server (apienv), with this
// package's helpers as methods.
type bundle struct{ *apienv.Env }

// setup starts a redis-server, a fake SMS API, the API with tokens for
// acme and globex, and an admin token. SMS ask for status callbacks at the
// API. env adds or overrides variables.
func setup(t *testing.T, rules string, env map[string]string) *bundle {
	t.Helper()
	return &bundle{apienv.New(t, rules, env)}
}

// another starts a second API server on the bundle's configuration (and
// its Redis unless opts names another), serving on its own loopback
// address, for tests that need other Options; its tokens are the bundle's.
func (b *bundle) another(t *testing.T, opts app.APIOptions) *bundle {
	t.Helper()
	return &bundle{b.Another(t, opts)}
}

// markSent writes the limiter's done record of a notification, as a worker
// does after the provider took it.
func markSent(t *testing.T, b *bundle, tenant, id string) {
	t.Helper()
	lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(b.WorkerConfig.SubjectSecret), CompactMembers: b.WorkerConfig.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	rec := fmt.Sprintf("d1:%d", time.Now().UnixMilli())
	if err := b.RDB.Set(context.Background(), lim.StateKey(tenant, id), rec, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
}
