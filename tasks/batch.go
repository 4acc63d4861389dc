package tasks

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
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
// fields; "id" may be left out and is then a new UUIDv7, increasing in line
// order). Blank lines and lines starting with '#' are skipped. Every line
// is read and checked: good lines come back in order, bad ones as
// LineErrors, in line order. A read error (I/O, a line over MaxLineBytes)
// stops reading and is returned as err, with the lines before it.
//
// Lines are decoded in blocks on GOMAXPROCS goroutines while reading goes
// on (decoding is most of the time a large file takes); ids are given and
// repeats found afterwards, in line order.
func ReadBatch(r io.Reader) (good []BatchLine, bad []LineError, err error) {
	workers := runtime.GOMAXPROCS(0)
	jobs := make(chan *batchBlock, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for b := range jobs {
				b.decode()
			}
		})
	}
	blocks, total, err := scanBlocks(r, jobs)
	close(jobs)
	wg.Wait()
	good = make([]BatchLine, 0, total)
	seen := make(map[string]int, total)
	for _, b := range blocks {
		for i, d := range b.out {
			line := b.lines[i]
			switch {
			case d.err != nil:
				bad = append(bad, LineError{Line: line, Err: d.err})
				continue
			case d.noID:
				d.n.ID = NewID()
			}
			if first, dup := seen[d.n.ID]; dup {
				bad = append(bad, LineError{Line: line, Err: fmt.Errorf("%w: id %s already on line %d", ErrDuplicate, d.n.ID, first)})
				continue
			}
			seen[d.n.ID] = line
			good = append(good, BatchLine{Line: line, Notification: d.n})
		}
	}
	return good, bad, err
}

// batchLines is how many lines a decoding goroutine takes at once.
const batchLines = 256

// batchBlock is some consecutive lines of a batch, and what they decode to.
type batchBlock struct {
	lines []int  // line numbers
	ends  []int  // each line's end in text
	text  []byte // the lines, trimmed, one after the other
	out   []decoded
}

type decoded struct {
	n    Notification
	noID bool // the line had no id: n.ID is a stand-in
	err  error
}

func (b *batchBlock) decode() {
	b.out = make([]decoded, len(b.lines))
	start := 0
	for i, end := range b.ends {
		d := &b.out[i]
		d.n, d.noID, d.err = decodeLine(b.text[start:end])
		start = end
	}
}

// scanBlocks reads r's lines into blocks, handing each full one to jobs,
// and returns them all in order with how many lines they hold.
func scanBlocks(r io.Reader, jobs chan<- *batchBlock) ([]*batchBlock, int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	var blocks []*batchBlock
	cur := &batchBlock{}
	total, line := 0, 0
	flush := func() {
		if len(cur.lines) > 0 {
			jobs <- cur
			blocks = append(blocks, cur)
			total += len(cur.lines)
			cur = &batchBlock{}
		}
	}
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		cur.text = append(cur.text, b...)
		cur.lines, cur.ends = append(cur.lines, line), append(cur.ends, len(cur.text))
		if len(cur.lines) == batchLines {
			flush()
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return blocks, total, fmt.Errorf("line %d: longer than %d bytes: %w", line+1, MaxLineBytes, ErrInvalid)
		}
		return blocks, total, fmt.Errorf("read batch: %w", err)
	}
	return blocks, total, nil
}

// standInID is the id a line without one is decoded with; ReadBatch then
// gives it its own, in line order.
const standInID = "00000000000070008000000000000000"

// decodeLine decodes one line; noID: it had no id (n.ID is standInID).
func decodeLine(b []byte) (n Notification, noID bool, err error) {
	n, err = Decode(b)
	if err == nil {
		return n, false, nil
	}
	// An absent id is allowed in a batch: decode it with a stand-in.
	var probe struct {
		ID *string `json:"id"`
	}
	if jsonErr := json.Unmarshal(b, &probe); jsonErr == nil && probe.ID == nil {
		withID, mErr := injectID(b, standInID)
		if mErr == nil {
			n, err = Decode(withID)
			return n, err == nil, err
		}
	}
	return Notification{}, false, err
}
