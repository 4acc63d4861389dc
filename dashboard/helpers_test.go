package dashboard_test

import (
	"testing"

	"github.com/sluicehq/sluice/testkit/apienv"
)

const adminToken = apienv.AdminToken

// bundle is the API server with the dashboard mounted on it, as `sluice
// api` runs them, on a private redis-server (apienv), with this package's
// helpers as methods.
type bundle struct{ *apienv.Env }

// setup starts a redis-server, a fake SMS API (for a worker the test may
// run), the API with the dashboard, tokens for acme and globex, and an
// admin token. env adds or overrides variables.
func setup(t *testing.T, rules string, env map[string]string) *bundle {
	t.Helper()
	return &bundle{apienv.New(t, rules, env)}
}
