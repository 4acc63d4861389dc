package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/go-openapi/jsonpointer"
)

// The Idempotency-Key parser never panics, takes what it accepts to a key
// of 1–255 printable characters, and reads a key it quoted back the same.
func FuzzParseIdempotencyKey(f *testing.F) {
	for _, s := range []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `order-42`, `"a\"b\\c"`, `""`, `"x"; p=1`, `  "pad"  `, "\"\x00\"", `"unterminated`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		h.Set(HeaderIdempotencyKey, v)
		key, ok, err := ParseIdempotencyKey(h)
		if err != nil {
			return
		}
		if !ok || key == "" || len(key) > MaxIdempotencyKey {
			t.Fatalf("%q → %q, %v", v, key, ok)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("%q → key with byte %#x", v, key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		h.Set(HeaderIdempotencyKey, quoted)
		if again, _, err := ParseIdempotencyKey(h); err != nil || again != key {
			t.Fatalf("%q → %q; quoted %q → %q, %v", v, key, quoted, again, err)
		}
	})
}

// Any body decodes without panicking; what decodes without errors is a
// notification that validates; decoding every field at once (decodeAll)
// gives exactly what decoding them one by one gives.
func FuzzDecodeNotification(f *testing.F) {
	for _, s := range []string{`{"channel":"sms","to":"+14155550100","body":"hi"}`, `{"channel":"email","to":"a@b.co","subject":"s","body":"b","ttl":"1h"}`,
		`{"channel":"sms","to":"x","body":"","tz":"Nowhere/City","metadata":{"a":1}}`, `[]`, `{"id":"x"}`, `{"notifications":[{}]}`, `null`,
		`{"channel":"sms","To":"+14155550100","to":"+14155550101","body":"hi"}`, `{"channel":"sms","to":"+14155550100","body":"hi","expires_at":"2026-01-02T03:04:04Z"}`,
		`{"channel":"sms","to":"+14155550100","body":"hi","expires_at":"2027-01-02T03:04:04Z","ttl":1}`, `{"channel":"sms","to":"+14155550100","body":"hi","colour":"red"}`} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		items, _, problem := splitBatch(body)
		if problem != nil {
			return
		}
		for _, raw := range items {
			d := decodeNotification(json.RawMessage(raw), now)
			if slow := decodeOne(json.RawMessage(raw), now, false); !reflect.DeepEqual(d, slow) {
				t.Fatalf("%s decoded at once: %+v; field by field: %+v", raw, d, slow)
			}
			if len(d.Bad) > 0 {
				continue
			}
			n := d.N
			n.ID, n.Tenant = "fuzz", "fuzz"
			if err := n.Validate(); err != nil {
				t.Fatalf("%s decoded without complaint but does not validate: %v", raw, err)
			}
		}
	})
}

// A status callback's form either is refused, field by field, or yields a
// status Sluice records, an error code and SID it can store, and a
// recipient that is an E.164 number or nothing.

// duplicateMember finds a repeated member name exactly when an
// independent decoder (go-json-experiment's jsontext, which refuses
// duplicate names) does, and its pointer resolves in the body and ends
// with the name.
func FuzzDuplicateMember(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"a":{"b":1,"b":2}}`, `[{"a":1},{"a":1}]`, `{"a":[{"x":1,"x":1}]}`, `{`, `"x"`,
		`{"a~/":1,"a~/":1}`, `{"a":1,"\u0061":2}`, `{"notifications":[{"to":"x"},{"to":"y","to":"z"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		name, ptr, found := duplicateMember(body)
		var v any
		if json.Unmarshal(body, &v) != nil || !utf8.Valid(body) {
			return // not JSON (the decoder says why), or names the two decoders read differently
		}
		err := jsontext.NewDecoder(bytes.NewReader(body)).SkipValue()
		var se *jsontext.SyntacticError
		dup := errors.As(err, &se) && strings.Contains(se.Error(), "duplicate")
		if found != dup {
			t.Fatalf("%s: found %v (%q at %q), jsontext: %v", body, found, name, ptr, err)
		}
		if !found {
			return
		}
		p, err := jsonpointer.New(ptr)
		if err != nil {
			t.Fatalf("pointer %q: %v", ptr, err)
		}
		if _, _, err := p.Get(v); err != nil {
			t.Fatalf("pointer %q does not resolve in %s: %v", ptr, body, err)
		}
		if !strings.HasSuffix(ptr, "/"+pointerToken(name)) {
			t.Fatalf("pointer %q does not end with the name %q", ptr, name)
		}
	})
}

// invalidText finds a string that is not UTF-8 text exactly when a JSON
// body (by encoding/json) holds invalid bytes or a lone surrogate escape:
// a body without one decodes the same leniently and strictly; one with it
// is named by a pointer that resolves in the body as encoding/json reads
// it.
func FuzzInvalidText(f *testing.F) {
	for _, s := range []string{`{"a":"\ud800"}`, "{\"a\":\"\xff\"}", `{"a":"\ud83d\ude00"}`, `{"a":["x","\udc00"]}`, "{\"\xc3\":1}", `{"a":1}`, `{`, `"\ud800"`,
		`{"notifications":[{"body":"ok"},{"body":"\uDBFF"}]}`, `{"a/b":{"c~d":"\ud800x"}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		name, ptr, found := invalidText(body)
		var v any
		if json.Unmarshal(body, &v) != nil {
			if found {
				t.Fatalf("%q: not JSON to encoding/json, yet found %q at %q", body, name, ptr)
			}
			return
		}
		strict := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true)).SkipValue() == nil
		lenient := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)).SkipValue() == nil
		if want := lenient && !strict; found != want {
			t.Fatalf("%q: found %v (%q at %q), want %v", body, found, name, ptr, want)
		}
		if !found {
			return
		}
		if ptr == "" {
			return // the whole body is the string
		}
		p, err := jsonpointer.New(ptr)
		if err != nil {
			t.Fatalf("pointer %q: %v", ptr, err)
		}
		if _, _, err := p.Get(v); err != nil {
			t.Fatalf("pointer %q does not resolve in %q: %v", ptr, body, err)
		}
	})
}
