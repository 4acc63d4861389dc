package throttle_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// calls reads how many times Redis ran cmd (INFO commandstats).
func calls(t *testing.T, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// On a Redis with functions the limiter runs as its function library
// (FCALL, loaded on first use), loads it again when the server lost it
// (FUNCTION FLUSH, a new node), and runs as the script (EVALSHA) where
// the connection may not use functions. Every way gives the same answers.
func TestLimiterRunsAsFunctionOrScript(t *testing.T) {
	t.Parallel()
	srv, admin := redistest.New(t)
	lim := recipient(throttle.Rule{Limit: 2, Window: time.Minute})
	check := func(l *throttle.Limiter, group string, want ...throttle.Status) {
		t.Helper()
		for i, w := range want {
			d, err := l.Reserve(ctx, group, "m"+strconv.Itoa(i), throttle.ReserveOptions{}, lim)
			if err != nil || d.Status != w {
				t.Fatalf("%s check %d: %v, %v; want %v", group, i, d.Status, err, w)
			}
		}
	}
	l, err := throttle.New(admin, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	admin.ConfigResetStat(ctx)
	check(l, "a", throttle.StatusAdmitted, throttle.StatusAdmitted, throttle.StatusDenied)
	if f, e := calls(t, admin, "fcall"), calls(t, admin, "evalsha")+calls(t, admin, "eval"); f < 3 || e != 0 {
		t.Fatalf("%d FCALLs and %d script calls; want every check as the function", f, e)
	}
	libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: scripts.Limiter.Name}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("function libraries named %s: %v, %v", scripts.Limiter.Name, libs, err)
	}
	// The server loses its functions: the next check loads them again.
	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	check(l, "b", throttle.StatusAdmitted, throttle.StatusAdmitted, throttle.StatusDenied)
	// A user whose ACL forbids functions: the script, with the same answers.
	if err := admin.Do(ctx, "ACL", "SETUSER", "scripts-only", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-fcall_ro", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	limited := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "scripts-only", Password: "pw"})
	defer limited.Close()
	ls, err := throttle.New(limited, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	admin.ConfigResetStat(ctx)
	check(ls, "c", throttle.StatusAdmitted, throttle.StatusAdmitted, throttle.StatusDenied)
	if e := calls(t, admin, "evalsha") + calls(t, admin, "eval"); e < 3 {
		t.Fatalf("%d script calls for the user without functions; want every check as the script", e)
	}
	// Both ways see one window: the function's limiter is full in "c" too.
	check(l, "c", throttle.StatusDenied)
}
