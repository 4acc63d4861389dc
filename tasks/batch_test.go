package tasks_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/tasks"
)

func TestReadBatch(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"tenant":"acme","channel":"sms","to":"+14155550100","body":"one"}`,
		``,
		`# a comment`,
		`{"id":"n-2","tenant":"acme","channel":"email","to":"a@example.com","subject":"S","body":"two"}`,
		`{"id":"n-3","tenant":"acme","channel":"sms","to":"12","body":"bad number"}`,
		`not json`,
		`{"id":"n-2","tenant":"acme","channel":"sms","to":"+14155550100","body":"dup id"}`,
		`{"tenant":"acme","channel":"sms","to":"+14155550100","body":"x","extra":true}`,
	}, "\n")
	good, bad, err := tasks.ReadBatch(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(good) != 2 || good[0].Line != 1 || good[0].Notification.ID == "" || good[1].Line != 4 || good[1].Notification.ID != "n-2" {
		t.Fatalf("good = %+v", good)
	}
	var lines []int
	for _, e := range bad {
		lines = append(lines, e.Line)
	}
	if len(bad) != 4 || lines[0] != 5 || lines[1] != 6 || lines[2] != 7 || lines[3] != 8 {
		t.Fatalf("bad lines %v: %v", lines, bad)
	}
	if !errors.Is(bad[2], tasks.ErrDuplicate) || !strings.Contains(bad[0].Error(), "line 5") {
		t.Fatalf("errors: %v", bad)
	}
	_, _, err = tasks.ReadBatch(strings.NewReader(strings.Repeat("x", tasks.MaxLineBytes+10)))
	if !errors.Is(err, tasks.ErrInvalid) {
		t.Fatalf("oversize line: %v", err)
	}
}

func FuzzReadBatch(f *testing.F) {
	f.Add([]byte(`{"tenant":"acme","channel":"sms","to":"+14155550100","body":"one"}` + "\n" + `{"id":"x"`))
	f.Add([]byte("\n\n# c\n{}\n"))
	f.Add([]byte(`{"id":null,"tenant":"acme","channel":"email","to":"a@example.com","subject":"s","body":"b"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		good, bad, err := tasks.ReadBatch(strings.NewReader(string(b)))
		_ = err
		ids := map[string]bool{}
		for _, g := range good {
			if err := g.Notification.Validate(); err != nil {
				t.Fatalf("line %d accepted but invalid: %v", g.Line, err)
			}
			if ids[g.Notification.ID] {
				t.Fatalf("duplicate id %s accepted", g.Notification.ID)
			}
			ids[g.Notification.ID] = true
		}
		for _, e := range bad {
			if e.Line < 1 || e.Err == nil || e.Error() == "" {
				t.Fatalf("rejection without a line or reason: %+v", e)
			}
		}
	})
}

// A file of many blocks (decoded concurrently) comes back exactly as one
// read line by line would: good lines in order, every bad one with its
// line in order, a repeat found across blocks, and the ids given to lines
// without one increasing in line order.
func TestReadBatchManyBlocks(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	var wantGood, wantBad []int
	for line := 1; line <= 2000; line++ {
		switch {
		case line%97 == 0:
			b.WriteString("not json")
			wantBad = append(wantBad, line)
		case line%89 == 0:
			b.WriteString("# a comment")
		case line == 1900: // repeats line 3's id, blocks away
			b.WriteString(`{"id":"n-3","tenant":"acme","channel":"sms","to":"+14155550100","body":"again"}`)
			wantBad = append(wantBad, line)
		case line%2 == 1:
			fmt.Fprintf(&b, `{"id":"n-%d","tenant":"acme","channel":"sms","to":"+14155550100","body":"%d"}`, line, line)
			wantGood = append(wantGood, line)
		default:
			fmt.Fprintf(&b, `{"tenant":"acme","channel":"sms","to":"+14155550100","body":"%d"}`, line)
			wantGood = append(wantGood, line)
		}
		b.WriteByte('\n')
	}
	good, bad, err := tasks.ReadBatch(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(good) != len(wantGood) {
		t.Fatalf("%d good lines, want %d", len(good), len(wantGood))
	}
	lastGiven := ""
	for i, g := range good {
		if g.Line != wantGood[i] || g.Notification.Body != strconv.Itoa(g.Line) {
			t.Fatalf("good[%d] = line %d body %q, want line %d", i, g.Line, g.Notification.Body, wantGood[i])
		}
		if g.Line%2 == 1 {
			if g.Notification.ID != fmt.Sprintf("n-%d", g.Line) {
				t.Fatalf("line %d: id %q", g.Line, g.Notification.ID)
			}
			continue
		}
		if id := g.Notification.ID; id <= lastGiven {
			t.Fatalf("line %d was given id %s, not after the previous line's %s", g.Line, id, lastGiven)
		}
		lastGiven = g.Notification.ID
	}
	if len(bad) != len(wantBad) {
		t.Fatalf("%d bad lines, want %d: %v", len(bad), len(wantBad), bad)
	}
	for i, e := range bad {
		if e.Line != wantBad[i] {
			t.Fatalf("bad[%d] is line %d, want %d", i, e.Line, wantBad[i])
		}
	}
	if i := slices.IndexFunc(bad, func(e tasks.LineError) bool { return e.Line == 1900 }); i < 0 || !errors.Is(bad[i], tasks.ErrDuplicate) || !strings.Contains(bad[i].Error(), "line 3") {
		t.Fatalf("the repeat: %v", bad)
	}
}
