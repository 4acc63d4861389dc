package throttle_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/throttle"
)

// The limiter library names the statuses of "R" once, as locals
// (limiter_prelude.lua); they must be the numbers throttle.Status gives
// them, under the same names.
func TestLuaStatusCodes(t *testing.T) {
	src := []byte(scripts.Limiter.Code)
	m := regexp.MustCompile(`(?m)^local (DENIED(?:, [A-Z]+)*) = ([0-9, ]+)$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("the limiter library declares no `local DENIED, ... = 0, ...` status line")
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
			t.Errorf("the limiter's %s = %d, which throttle.Status names %s", name, v, got)
		}
		seen[st] = true
	}
	for st := throttle.StatusDenied; st <= throttle.StatusBlocked; st++ {
		if !seen[st] {
			t.Errorf("throttle.Status %d (%s) has no name in the limiter library", st, st)
		}
	}
	// Every reply of "R" returns a named status, never a bare number.
	body, err := os.ReadFile("../scripts/op_reserve.lua")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), string(body)) {
		t.Fatal("the limiter library does not hold op_reserve.lua")
	}
	for _, bare := range regexp.MustCompile(`return \{-?\d+, `).FindAllString(string(body), -1) {
		t.Errorf("op_reserve.lua returns a bare status: %s", bare)
	}
	// And the record letters it writes are throttle's RecordKinds.
	for kind, want := range map[throttle.RecordKind]string{throttle.RecordBooked: "'b' ..", throttle.RecordAdmitted: "'a' ..", throttle.RecordDone: "'d' .."} {
		if !strings.Contains(string(src), want) || string(rune(kind)) != want[1:2] {
			t.Errorf("the limiter library writes no %s record", want)
		}
	}
}
