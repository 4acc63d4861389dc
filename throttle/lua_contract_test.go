package throttle_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/throttle"
)

// limiter.lua names the statuses of "R" once, as locals; they must be the
// numbers throttle.Status gives them, under the same names.
func TestLuaStatusCodes(t *testing.T) {
	src, err := os.ReadFile("../scripts/limiter.lua")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^local (DENIED(?:, [A-Z]+)*) = ([0-9, ]+)$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("limiter.lua declares no `local DENIED, ... = 0, ...` status line")
	}
	names, values := strings.Split(string(m[1]), ", "), strings.Split(string(m[2]), ", ")
	if len(names) != len(values) {
		t.Fatalf("%d status names for %d values", len(names), len(values))
	}
	seen := map[throttle.Status]bool{}
	for i, name := range names {
		v, err := strconv.Atoi(values[i])
		if err != nil {
			t.Fatal(err)
		}
		st := throttle.Status(v)
		if got := strings.ToUpper(st.String()); got != name {
			t.Errorf("limiter.lua's %s = %d, which throttle.Status names %s", name, v, got)
		}
		seen[st] = true
	}
	for st := throttle.StatusDenied; st <= throttle.StatusBlocked; st++ {
		if !seen[st] {
			t.Errorf("throttle.Status %d (%s) has no name in limiter.lua", st, st)
		}
	}
	// Every reply of "R" returns a named status, never a bare number.
	body, ok := between(string(src), "local function reserve(", "local function place(")
	if !ok {
		t.Fatal("limiter.lua has no reserve function before place")
	}
	for _, bare := range regexp.MustCompile(`return \{-?\d+, `).FindAllString(body, -1) {
		t.Errorf("limiter.lua returns a bare status: %s", bare)
	}
	// And the record letters it writes are throttle's RecordKinds.
	for kind, want := range map[throttle.RecordKind]string{throttle.RecordBooked: "'b' ..", throttle.RecordAdmitted: "'a' ..", throttle.RecordDone: "'d' .."} {
		if !strings.Contains(string(src), want) || string(rune(kind)) != want[1:2] {
			t.Errorf("limiter.lua writes no %s record", want)
		}
	}
}

func between(s, from, to string) (string, bool) {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(rest, to)
	return body, ok
}
