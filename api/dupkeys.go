package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// refuseDuplicate answers 422 duplicate-member, and reports true, when
// body repeats a member name within one object.
func refuseDuplicate(w http.ResponseWriter, body []byte) bool {
	name, ptr, dup := duplicateMember(body)
	if !dup {
		return false
	}
	writeProblem(w, http.StatusUnprocessableEntity, "duplicate-member",
		"a member name appears twice in one object; send each once (nothing was done)",
		bodyParam(name, "repeats an earlier member of the same object", ptr))
	return true
}

// duplicateMember returns the name and RFC 6901 JSON Pointer of the first
// member of body whose name an earlier member of the same object already
// has, and whether there is one. encoding/json keeps the last of two such members;
// a validating proxy in front of the API may keep the first, and then it
// would have checked another body than the one Sluice sends. Input that is
// not JSON reports none: the decoder that reads the body next says why.
func duplicateMember(body []byte) (name, pointer string, found bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		object bool
		seen   map[string]bool
		key    string // the member or index whose value is being read
		index  int
		expect bool // object: the next token is a member name
	}
	var stack []*frame
	at := func(last string) string {
		var b []byte
		for _, f := range stack[:len(stack)-1] {
			b = append(append(b, '/'), pointerToken(f.key)...)
		}
		return string(append(append(b, '/'), pointerToken(last)...))
	}
	for {
		tok, err := dec.Token()
		if err != nil { // the end (io.EOF), or not JSON: the decoder that reads the body says why
			return "", "", false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.expect {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				continue
			}
			name, _ = tok.(string)
			if top.seen[name] {
				return name, at(name), true
			}
			top.seen[name], top.key, top.expect = true, name, false
			continue
		}
		if top != nil && !top.object {
			if d, ok := tok.(json.Delim); ok && d == ']' {
				stack = stack[:len(stack)-1]
				continue
			}
			top.key = strconv.Itoa(top.index)
			top.index++
		}
		if top != nil && top.object {
			top.expect = true // this token is the member's value (or opens it)
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, seen: map[string]bool{}, expect: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		}
	}
}

// refuseAmbiguous answers 422 and reports true for a JSON body two readers
// could read differently: a repeated member name (duplicate-member), or a
// string that is not Unicode text (invalid-text).
func refuseAmbiguous(w http.ResponseWriter, body []byte) bool {
	return refuseDuplicate(w, body) || refuseInvalidText(w, body)
}

// refuseInvalidText answers 422 invalid-text, and reports true, when a
// string of body (a member name or a value) holds bytes that are not UTF-8
// or a \u escape of a lone UTF-16 surrogate. encoding/json would replace
// either with U+FFFD and go on: the notification sent would not be the
// one asked for, so it is refused, the member named.
func refuseInvalidText(w http.ResponseWriter, body []byte) bool {
	name, ptr, bad := invalidText(body)
	if !bad {
		return false
	}
	writeProblem(w, http.StatusUnprocessableEntity, "invalid-text",
		"a string is not valid UTF-8 text (invalid bytes, or a lone surrogate escape such as \\ud800); nothing was done",
		bodyParam(name, "is not valid UTF-8 text", ptr))
	return true
}

// invalidText returns the name and RFC 6901 JSON Pointer of the first
// string of body that is not valid Unicode text, and whether there is one.
// Input that is not JSON otherwise reports none: the decoder that reads
// the body next says why.
func invalidText(body []byte) (name, pointer string, found bool) {
	if valueOK(body, false) || !valueOK(body, true) {
		return "", "", false
	}
	d := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true))
	for {
		_, err := d.ReadToken()
		if err == nil {
			continue
		}
		var se *jsontext.SyntacticError
		if !errors.As(err, &se) {
			return "", "", false
		}
		ptr := string(se.JSONPointer)
		last := se.JSONPointer.LastToken()
		return last, ptr, true
	}
}

// valueOK reports whether body is one JSON value, strings that are not
// UTF-8 text allowed or not.
func valueOK(body []byte, allowInvalid bool) bool {
	d := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(allowInvalid))
	if _, err := d.ReadValue(); err != nil {
		return false
	}
	_, err := d.ReadToken()
	return errors.Is(err, io.EOF)
}
