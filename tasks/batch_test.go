package tasks_test

import (
	"errors"
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
