package plans

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nyaruka/phonenumbers"
)

var (
	// ErrBadZone is wrapped by Zones' error for a tz that is not an IANA
	// zone name this machine knows.
	ErrBadZone = errors.New("plans: bad time zone")
	// ErrNoZone is wrapped by Zones' error when it would fall back and the
	// fallback is nil.
	ErrNoZone = errors.New("plans: no time zone")
)

// Zones returns the candidate time zones of a recipient, in this order of
// preference:
//
//  1. tz, an IANA zone name such as "America/New_York", if it is not empty
//     (after trimming spaces). A name time.LoadLocation does not know is an
//     error wrapping ErrBadZone, and so are "Local" (the worker's own zone,
//     never a recipient's), paths, and names over 64 bytes.
//  2. The zones phonenumbers gives for phone, an E.164 number such as
//     "+19075550100": one zone for most numbers, several for some (+1 907,
//     Alaska: Adak and Anchorage; a +1 800 toll-free number: every zone of
//     the North American Numbering Plan). Names this machine's zone data
//     does not know are skipped.
//  3. fallback, the tenant's or deployment's zone, when tz is empty and
//     phone is empty, is not a number in international form, or maps to no
//     known zone ("Etc/Unknown": satellite, international freephone). A nil
//     fallback is then an error wrapping ErrNoZone.
//
// The result is never empty when the error is nil, and holds no duplicates.
// Loaded zones are cached; Zones is safe for concurrent use.
func Zones(tz, phone string, fallback *time.Location) ([]*time.Location, error) {
	if tz = strings.TrimSpace(tz); tz != "" {
		loc, err := loadZone(tz)
		if err != nil {
			return nil, err
		}
		return []*time.Location{loc}, nil
	}
	var zones []*time.Location
	for _, name := range phoneZones(phone) {
		if loc, err := loadZone(name); err == nil && !containsLoc(zones, loc) {
			zones = append(zones, loc)
		}
	}
	if len(zones) > 0 {
		return zones, nil
	}
	if fallback == nil {
		return nil, fmt.Errorf("%w: no zone from tz or phone, and no fallback", ErrNoZone)
	}
	return []*time.Location{fallback}, nil
}

// phoneZones returns the zone names phonenumbers gives for phone, without
// "Etc/Unknown"; nil for anything it cannot parse. A panic inside the
// library on some odd input is taken as "unknown" rather than crashing a
// worker over one payload.
func phoneZones(phone string) (names []string) {
	phone = strings.TrimSpace(phone)
	if phone == "" {
		return nil
	}
	defer func() {
		if recover() != nil {
			names = nil
		}
	}()
	// No default region: only numbers in international form (+CC…) parse.
	num, err := phonenumbers.Parse(phone, "")
	if err != nil {
		return nil
	}
	all, err := phonenumbers.GetTimezonesForNumber(num)
	if err != nil {
		return nil
	}
	for _, name := range all {
		if name != "" && name != phonenumbers.UNKNOWN_TIMEZONE {
			names = append(names, name)
		}
	}
	return names
}

// zoneCache holds the locations loaded so far, by name. Only names that
// loaded are kept, so it is bounded by the zone database.
var zoneCache sync.Map // string → *time.Location

// maxZoneNameLen bounds a zone name; the longest IANA name has 32 bytes.
const maxZoneNameLen = 64

// loadZone loads an IANA zone by name; "Local" is refused.
func loadZone(name string) (*time.Location, error) {
	if loc, ok := zoneCache.Load(name); ok {
		return loc.(*time.Location), nil
	}
	if len(name) > maxZoneNameLen {
		return nil, fmt.Errorf("%w: a name of %d bytes, at most %d", ErrBadZone, len(name), maxZoneNameLen)
	}
	if name == "Local" {
		return nil, fmt.Errorf("%w %q: the worker's own zone is no recipient's", ErrBadZone, name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrBadZone, name, err)
	}
	zoneCache.Store(name, loc)
	return loc, nil
}

func containsLoc(zones []*time.Location, loc *time.Location) bool {
	for _, z := range zones {
		if z == loc || z.String() == loc.String() {
			return true
		}
	}
	return false
}
