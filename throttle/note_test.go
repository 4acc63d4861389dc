package throttle_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// A note is written by the call that admits the send, and by no other: a
// denied, booked or blocked check leaves no record of a send that did not
// happen. Its TTL counts from the slot.
func TestNoteIsWrittenOnlyWithAnAdmission(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 1, Window: 10 * time.Second})
	note := func(id string) *throttle.Note {
		return &throttle.Note{Key: b.lim.RecordKey(b.group, id, "to"), Value: "whom-" + id, TTL: time.Minute}
	}
	read := func(id string) (string, time.Duration) {
		k := b.lim.RecordKey(b.group, id, "to")
		v, err := b.client.Get(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			return "", 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return v, b.client.PTTL(ctx, k).Val()
	}
	o := throttle.ReserveOptions{Policy: throttle.AtLeastOnce, Horizon: 2 * time.Second}
	o.Note = note("a")
	if d, err := b.lim.Reserve(ctx, b.group, "a", o, lim); err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("a: %+v %v", d, err)
	}
	if v, ttl := read("a"); v != "whom-a" || ttl <= 59*time.Second || ttl > time.Minute {
		t.Fatalf("a's note %q ttl %v, want whom-a for a minute", v, ttl)
	}
	o.Note = note("b") // denied: the window is full for 10 s, beyond the horizon
	if d, err := b.lim.Reserve(ctx, b.group, "b", o, lim); err != nil || d.Status != throttle.StatusDenied {
		t.Fatalf("b: %+v %v", d, err)
	}
	o.Book = true
	o.Note = note("c")
	if d, err := b.lim.Reserve(ctx, b.group, "c", o, lim); err != nil || d.Status != throttle.StatusBooked {
		t.Fatalf("c: %+v %v", d, err)
	}
	for _, id := range []string{"b", "c"} {
		if v, _ := read(id); v != "" {
			t.Fatalf("%s was not admitted but its note reads %q", id, v)
		}
	}
	// c asks again 1 s before its slot: admitted for the slot, the note's
	// TTL runs from there.
	b.clock.Add(9 * time.Second)
	if d, err := b.lim.Reserve(ctx, b.group, "c", o, lim); err != nil || d.Status != throttle.StatusAdmitted || d.Wait <= 0 {
		t.Fatalf("c again: %+v %v", d, err)
	}
	if v, ttl := read("c"); v != "whom-c" || ttl <= time.Minute {
		t.Fatalf("c's note %q ttl %v, want whom-c for a minute from its slot", v, ttl)
	}
	// A blocked check writes none.
	if err := b.client.Set(ctx, b.lim.RecordKey(b.group, "d", "block"), 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	o.Block, o.Note = b.lim.RecordKey(b.group, "d", "block"), note("d")
	if d, err := b.lim.Reserve(ctx, b.group, "d", o); err != nil || d.Status != throttle.StatusBlocked {
		t.Fatalf("d: %+v %v", d, err)
	}
	if v, _ := read("d"); v != "" {
		t.Fatalf("blocked d's note reads %q", v)
	}
	// Bad notes are refused before anything is written.
	bad := []throttle.ReserveOptions{
		{Policy: throttle.AtLeastOnce, Note: &throttle.Note{Key: "", TTL: time.Minute}},
		{Policy: throttle.AtLeastOnce, Note: &throttle.Note{Key: b.lim.RecordKey(b.group, "e", "to"), TTL: 0}},
	}
	for i, bo := range bad {
		if _, err := b.lim.Reserve(ctx, b.group, "e", bo, lim); !errors.Is(err, throttle.ErrInvalidRule) {
			t.Fatalf("bad note %d: %v, want ErrInvalidRule", i, err)
		}
	}
	if n := b.client.Exists(ctx, b.lim.StateKey(b.group, "e")).Val(); n != 0 {
		t.Fatal("a refused note left a state record")
	}
}

// On a Cluster, a check across groups writes its note in the own group
// with the admission.
func TestNoteAcrossGroupsOnCluster(t *testing.T) {
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	l, err := throttle.New(cc, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sender := throttle.Limit{Scope: "sms:sender", Subject: "+15005550006", Group: "~shared", Rule: throttle.Rule{Limit: 1, Window: time.Minute}}
	rcpt := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 3, Window: time.Minute}}
	for i, id := range []string{"x", "y"} {
		o := throttle.ReserveOptions{Horizon: time.Second, Note: &throttle.Note{Key: l.RecordKey("acme", id, "to"), Value: id, TTL: time.Minute}}
		d, err := l.Reserve(ctx, "acme", id, o, rcpt, sender)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := cc.Get(ctx, l.RecordKey("acme", id, "to")).Result()
		if admitted := d.Status == throttle.StatusAdmitted; admitted != (i == 0) || (got == id) != admitted {
			t.Fatalf("%s: %v, note %q; want the first admitted with its note and the second denied without", id, d.Status, got)
		}
	}
}

// Records reads what Record reads, id by id, in one round trip: a done
// record, none, and one this version cannot read (nil, as Record says).
func TestRecordsReadsWhatRecordReads(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := context.Background()
	ids := []string{"done", "none", "garbled", "done-again"}
	for id, raw := range map[string]string{"done": "d1:1700000000000", "garbled": "zz", "done-again": "d2:1700000001000"} {
		if err := b.client.Set(ctx, b.lim.StateKey(b.group, id), raw, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.lim.Records(ctx, b.group, ids)
	if err != nil || len(got) != len(ids) {
		t.Fatalf("Records = %v, %v", got, err)
	}
	for i, id := range ids {
		want, err := b.lim.Record(ctx, b.group, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[i], want) {
			t.Errorf("%s: Records gave %+v, Record %+v", id, got[i], want)
		}
	}
	if got[0] == nil || got[0].Kind != throttle.RecordDone || got[1] != nil || got[2] != nil {
		t.Errorf("Records = %+v %+v %+v", got[0], got[1], got[2])
	}
}
