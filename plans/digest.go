package plans

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// MaxDigestItems bounds a digest's items (Digest.Max).
const MaxDigestItems = 1000

// Digest is a digest rule (KindDigest): notifications of its channel and
// category that the rules would defer to a later slot are folded into one
// message sent at that slot, instead of one each at a slot of their own.
type Digest struct {
	// Max is the most items one digest carries (the notification that
	// opened it included); the next item starts the next digest.
	Max int
	// Window holds even the first item this long, to gather a burst (0:
	// the first goes as soon as its rules allow).
	Window time.Duration
	// Key names a metadata field: one digest per value of it (e.g. one per
	// thread); "" one per recipient.
	Key string
}

// String prints the rule's value as parseDigest reads it.
func (d Digest) String() string {
	s := "max:" + strconv.Itoa(d.Max)
	if d.Window > 0 {
		s += "+window:" + d.Window.String()
	}
	if d.Key != "" {
		s += "+key:" + d.Key
	}
	return s
}

// GroupOf is the digest group of n under d: the recipient, and the value of
// d.Key in n's metadata ("" when d has no key or n no such field).
func (d Digest) GroupOf(n tasks.Notification) string {
	if d.Key == "" {
		return ""
	}
	return n.Metadata[d.Key]
}

// parseDigest reads CHANNEL[.CATEGORY]:digest=max:N[+window:DURATION][+key:FIELD].
func parseDigest(e Entry, t entryText) (Entry, error) {
	if !t.hasValue || t.value == "" {
		return e, errors.New("want digest=max:N[+window:DURATION][+key:FIELD], e.g. digest=max:50")
	}
	var d Digest
	seen := map[string]bool{}
	for _, part := range strings.Split(t.value, "+") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok || seen[k] {
			return e, fmt.Errorf("digest %q: want max:N, then optionally +window:DURATION and +key:FIELD, each once", t.value)
		}
		seen[k] = true
		switch k {
		case "max":
			n, err := strconv.Atoi(v)
			if err != nil || n < 2 || n > MaxDigestItems {
				return e, fmt.Errorf("digest max %q: want a whole number of items from 2 to %d", v, MaxDigestItems)
			}
			d.Max = n
		case "window":
			w, err := parseDuration(v)
			if err != nil || w < time.Second || w > 24*time.Hour {
				return e, fmt.Errorf("digest window %q: want a duration from 1s to 24h (e.g. 30s, 10m)", v)
			}
			d.Window = w
		case "key":
			if v == "" || len(v) > 64 || strings.ContainsAny(v, " ,=+:") {
				return e, fmt.Errorf("digest key %q: want the name of a metadata field (at most 64 characters, none of ' ,=+:')", v)
			}
			d.Key = v
		default:
			return e, fmt.Errorf("digest %q: %q is not max, window or key", t.value, k)
		}
	}
	if d.Max == 0 {
		return e, fmt.Errorf("digest %q: max:N is required (the most items one digest carries)", t.value)
	}
	e.Kind, e.Digest = KindDigest, &d
	return e, nil
}

// DigestOf is a category's digest rule (Policy.Digests).
type DigestOf struct {
	Category string // "" for a channel's rule that covers its categories
	Digest   Digest
}

// Digests lists the digest rules that apply to tenant's notifications on
// ch, its own replacing the default of the same category, by category.
func (p Policy) Digests(tenant string, ch tasks.Channel) []DigestOf {
	var out []DigestOf
	seen := map[string]int{}
	for _, e := range p.entries {
		if e.Kind != KindDigest || e.Channel != ch || (e.Tenant != "" && e.Tenant != tenant) {
			continue
		}
		if i, ok := seen[e.Category]; ok {
			if e.Tenant != "" {
				out[i].Digest = *e.Digest
			}
			continue
		}
		seen[e.Category] = len(out)
		out = append(out, DigestOf{Category: e.Category, Digest: *e.Digest})
	}
	return out
}
