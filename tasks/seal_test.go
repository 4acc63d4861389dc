package tasks_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/tasks"
)

// Keys rotate without downtime: a ring with a new first key seals with it
// and still opens what the old key sealed; a ring without the old key does not.
func TestKeyringRotation(t *testing.T) {
	t.Parallel()
	oldSpec, newSpec := tasks.NewKeySpec("2026-05"), tasks.NewKeySpec("2026-11")
	old, err := tasks.ParseKeyring(oldSpec)
	if err != nil {
		t.Fatal(err)
	}
	both, err := tasks.ParseKeyring(newSpec + "," + oldSpec)
	if err != nil {
		t.Fatal(err)
	}
	onlyNew, _ := tasks.ParseKeyring(newSpec)
	n := tasks.NewSMS("acme", "+14155550100", "code 424242")
	sealedOld, _ := tasks.NewTask(n, old)
	n2 := tasks.NewSMS("acme", "+14155550101", "code 525252")
	sealedNew, _ := tasks.NewTask(n2, both)
	if !strings.HasPrefix(string(sealedNew.Payload()), "sealed.v1.2026-11.") || both.SealingKey() != "2026-11" {
		t.Fatalf("the first key must seal: %.30s", sealedNew.Payload())
	}
	if got, err := tasks.Open(both, n.ID, sealedOld.Type(), sealedOld.Payload(), false); err != nil || got.Body != "code 424242" {
		t.Fatalf("old payload under the rotated ring: %+v %v", got, err)
	}
	if _, err := tasks.Open(onlyNew, n.ID, sealedOld.Type(), sealedOld.Payload(), false); !errors.Is(err, tasks.ErrSealed) || !strings.Contains(err.Error(), `key "2026-05" is not in SLUICE_PAYLOAD_KEYS`) {
		t.Fatalf("old key dropped: %v", err)
	}
}

// A sealed payload opens only for its own task id and type, undamaged; plain
// payloads are refused unless allowed; nothing in a sealed payload is readable.
func TestSealedPayloadIsBound(t *testing.T) {
	t.Parallel()
	keys, _ := tasks.ParseKeyring(tasks.NewKeySpec("k"))
	n := tasks.NewEmail("acme", "ann@example.com", "Your receipt", "Total 12.50")
	task, _ := tasks.NewTask(n, keys)
	p := task.Payload()
	for _, s := range []string{"ann", "example.com", "receipt", "12.50", "acme"} {
		if strings.Contains(string(p), s) {
			t.Fatalf("sealed payload shows %q: %s", s, p)
		}
	}
	if _, err := tasks.Open(keys, n.ID, tasks.TypeSMS, p, false); !errors.Is(err, tasks.ErrSealed) {
		t.Fatalf("opened as another type: %v", err)
	}
	if _, err := tasks.Open(keys, "other-id", task.Type(), p, false); !errors.Is(err, tasks.ErrSealed) {
		t.Fatalf("opened for another task: %v", err)
	}
	damaged := []byte(string(p))
	damaged[len(damaged)-3] ^= 1
	if _, err := tasks.Open(keys, n.ID, task.Type(), damaged, false); !errors.Is(err, tasks.ErrSealed) {
		t.Fatalf("damaged payload: %v", err)
	}
	if _, err := tasks.Open(nil, n.ID, task.Type(), p, true); !errors.Is(err, tasks.ErrSealed) {
		t.Fatalf("no keys: %v", err)
	}
	plain, _ := tasks.NewTask(n, nil)
	if _, err := tasks.Open(keys, n.ID, task.Type(), plain.Payload(), false); !errors.Is(err, tasks.ErrNotSealed) {
		t.Fatalf("plain payload refused? %v", err)
	}
	if got, err := tasks.Open(keys, n.ID, task.Type(), plain.Payload(), true); err != nil || got.To != "ann@example.com" {
		t.Fatalf("plain payload allowed: %+v %v", got, err)
	}
	re, err := tasks.Reseal(keys, n, "copy-1", task.Type())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tasks.Open(keys, "copy-1", task.Type(), re, false); err != nil || got.ID != n.ID {
		t.Fatalf("resealed copy: %+v %v", got, err)
	}
}

func TestParseKeyringErrors(t *testing.T) {
	t.Parallel()
	secret := "q2pGKnJ0Qy1AJb4mJqXO2bIH7Q0gFzl8c3WJ5sO9nGU="
	for spec, want := range map[string]string{
		"":                                   "no key given",
		"k1":                                 "entry 1: want ID:BASE64KEY",
		"k1:" + secret + ",bad id:" + secret: "entry 2: want ID:BASE64KEY",
		"k1:" + secret + ",k1:" + secret:     `entry 2: key id "k1" given twice`,
		"k1:c2hvcnQ=":                        "entry 1 (k1): the key must be 32 bytes",
		"k1:!!!":                             "entry 1 (k1): the key must be 32 bytes",
	} {
		_, err := tasks.ParseKeyring(spec)
		if !errors.Is(err, tasks.ErrKeys) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", spec, err, want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error shows the key: %v", err)
		}
	}
	for _, ok := range []string{"k1:" + secret, " k1:" + strings.TrimRight(secret, "=") + " ", "k-1_x:" + strings.NewReplacer("+", "-", "/", "_").Replace(secret)} {
		if _, err := tasks.ParseKeyring(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

func FuzzParseKeyring(f *testing.F) {
	f.Add("k1:q2pGKnJ0Qy1AJb4mJqXO2bIH7Q0gFzl8c3WJ5sO9nGU=")
	f.Add("a:,b:c")
	f.Add(",,:")
	f.Fuzz(func(t *testing.T, spec string) {
		k, err := tasks.ParseKeyring(spec)
		if err != nil {
			if !errors.Is(err, tasks.ErrKeys) {
				t.Fatalf("error without ErrKeys: %v", err)
			}
			return
		}
		sealed := k.Seal("id", "t", []byte("hello"))
		if got, err := k.Open("id", "t", sealed); err != nil || string(got) != "hello" {
			t.Fatalf("round trip: %q %v", got, err)
		}
	})
}
