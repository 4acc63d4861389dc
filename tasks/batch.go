package tasks

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxLineBytes bounds one line of a batch file.
const MaxLineBytes = MaxPayloadBytes

// LineError is a rejected line of a batch file.
type LineError struct {
	Line int // 1-based
	Err  error
}

func (e LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e LineError) Unwrap() error { return e.Err }

// BatchLine is an accepted line of a batch file.
type BatchLine struct {
	Line         int
	Notification Notification
}

// ReadBatch reads JSON Lines, one notification per line (the payload's
// fields; "id" may be left out and is then a new UUIDv7). Blank lines and
// lines starting with '#' are skipped. Every line is read and checked: good
// lines come back in order, bad ones as LineErrors. A read error (I/O, a line
// over MaxLineBytes) stops reading and is returned as err.
func ReadBatch(r io.Reader) (good []BatchLine, bad []LineError, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	seen := map[string]int{}
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		n, err := decodeLine(b)
		if err != nil {
			bad = append(bad, LineError{Line: line, Err: err})
			continue
		}
		if first, dup := seen[n.ID]; dup {
			bad = append(bad, LineError{Line: line, Err: fmt.Errorf("%w: id %s already on line %d", ErrDuplicate, n.ID, first)})
			continue
		}
		seen[n.ID] = line
		good = append(good, BatchLine{Line: line, Notification: n})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return good, bad, fmt.Errorf("line %d: longer than %d bytes: %w", line+1, MaxLineBytes, ErrInvalid)
		}
		return good, bad, fmt.Errorf("read batch: %w", err)
	}
	return good, bad, nil
}

func decodeLine(b []byte) (Notification, error) {
	n, err := Decode(b)
	if err == nil {
		return n, nil
	}
	// An absent id is allowed in a batch: give it one and try again.
	var probe struct {
		ID *string `json:"id"`
	}
	if jsonErr := json.Unmarshal(b, &probe); jsonErr == nil && probe.ID == nil {
		withID, mErr := injectID(b)
		if mErr == nil {
			return Decode(withID)
		}
	}
	return Notification{}, err
}
