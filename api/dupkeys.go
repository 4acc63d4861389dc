package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
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
