package plans

import (
	"slices"
	"strings"
	"time"

	"github.com/nyaruka/phonenumbers"
)

// Preset names quiet hours that depend on where the recipient is and on the
// day of the week, rather than one daily span. The zero Preset is none.
type Preset string

// PresetTCPA ("tcpa") keeps marketing texts to the hours US law allows in
// the recipient's local time: the federal 8:00–21:00 (47 CFR
// 64.1200(c)(1)), narrowed where the recipient's state is stricter —
// Florida, Oklahoma, Maryland, Mississippi and New Jersey 8:00–20:00,
// Connecticut 9:00–20:00, Texas 9:00–21:00 Monday to Saturday and
// 12:00–21:00 on Sunday (SB 140, for texts from 1 September 2025). The
// state comes from the number (USStates); where it is unknown or
// ambiguous, every candidate's rule holds at once. The package
// documentation says how.
const PresetTCPA Preset = "tcpa"

// presetRules is what a preset needs to place its quiet spans.
type presetRules interface {
	// nights returns the quiet span of each local day for the recipient
	// with phone, and the zones to read it in (zones and maybe others).
	nights(zones []*time.Location, phone string) (nightFunc, []*time.Location)
}

var presets = map[Preset]presetRules{PresetTCPA: tcpa{}}

// presetNames lists the presets for error messages: "tcpa".
func presetNames() string {
	names := make([]string, 0, len(presets))
	for p := range presets {
		names = append(names, string(p))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// window is the part of a local day in which a send is allowed, from open
// (inclusive) to close (exclusive), open < close.
type window struct{ open, close Clock }

// and is the part of the day both windows allow.
func (w window) and(o window) window { return window{max(w.open, o.open), min(w.close, o.close)} }

func everyDay(open, close Clock) (week [7]window) {
	for d := range week {
		week[d] = window{open, close}
	}
	return week
}

// stateRule is a state's own window for telephone solicitations by text,
// stricter than the federal one on some days.
type stateRule struct {
	state string // USPS code
	// since is the first local day (days since 1970-01-01) on which the
	// rule holds; the rules in force before the Sluice release that added
	// them (all but Texas's) have 0.
	since int64
	week  [7]window // by time.Weekday
}

// federalWindow: 47 CFR 64.1200(c)(1), no telephone solicitation before
// 8 am or after 9 pm at the called party's location.
var federalWindow = window{ClockAt(8, 0), ClockAt(21, 0)}

// tcpaRules are the states whose law is stricter than the federal window.
var tcpaRules = []stateRule{
	{state: "FL", week: everyDay(ClockAt(8, 0), ClockAt(20, 0))},               // Florida Telephone Solicitation Act, Fla. Stat. § 501.616
	{state: "OK", week: everyDay(ClockAt(8, 0), ClockAt(20, 0))},               // Oklahoma Telephone Solicitation Act of 2022
	{state: "MD", week: everyDay(ClockAt(8, 0), ClockAt(20, 0))},               // Maryland Stop the Spam Calls Act of 2023
	{state: "MS", week: everyDay(ClockAt(8, 0), ClockAt(20, 0))},               // Mississippi telephone solicitation law
	{state: "NJ", week: everyDay(ClockAt(8, 0), ClockAt(20, 0))},               // New Jersey telemarketing law
	{state: "CT", week: everyDay(ClockAt(9, 0), ClockAt(20, 0))},               // Connecticut, Public Act 23-98
	{state: "TX", since: civilDay(2025, time.September, 1), week: texasWeek()}, // Tex. Bus. & Com. Code § 301.051, texts by SB 140
}

func texasWeek() [7]window {
	week := everyDay(ClockAt(9, 0), ClockAt(21, 0))
	week[time.Sunday] = window{ClockAt(12, 0), ClockAt(21, 0)}
	return week
}

// civilDay is a calendar date as days since 1970-01-01.
func civilDay(y int, m time.Month, d int) int64 {
	return floorDiv(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix(), secondsPerDay)
}

// areaZones are the zones an area code of a state with a rule of its own
// spans besides the one phonenumbers may give for a number: Florida's 850
// and its overlay 448 cover both sides of the Apalachicola (Eastern and
// Central), Texas's 432 reaches into Mountain time. A preset reads its
// window in these zones too.
var areaZones = map[string][]string{
	"850": {"America/New_York", "America/Chicago"},
	"448": {"America/New_York", "America/Chicago"},
	"432": {"America/Chicago", "America/Denver"},
}

// tcpaWindow is the window of a local day for a recipient who may be in any
// of states; nil states (unknown) means any state at all.
func tcpaWindow(states []string, day int64) window {
	w, wd := federalWindow, weekday(day)
	for _, r := range tcpaRules {
		if day >= r.since && (states == nil || slices.Contains(states, r.state)) {
			w = w.and(r.week[wd])
		}
	}
	return w
}

type tcpa struct{}

// nights: the quiet span that begins on a local day runs from that day's
// close to the next day's open, in every zone given and every zone of the
// number's area code (areaZones).
func (tcpa) nights(zones []*time.Location, phone string) (nightFunc, []*time.Location) {
	states, npa := usPlace(phone)
	for _, name := range areaZones[npa] {
		if loc, err := loadZone(name); err == nil && !containsLoc(zones, loc) {
			zones = append(slices.Clip(zones), loc)
		}
	}
	return func(day int64) (int64, int64) {
		return day*secondsPerDay + int64(tcpaWindow(states, day).close)*60,
			(day+1)*secondsPerDay + int64(tcpaWindow(states, day+1).open)*60
	}, zones
}

// strictAreaCodes are the area codes of the states in tcpaRules. A number
// with one of them counts as possibly in that state even where the
// geocoder names another (it puts one 201 exchange, a New Jersey code, in
// New York): its owner may well live there.
var strictAreaCodes = map[string]string{}

func init() {
	for st, codes := range map[string]string{
		"CT": "203 475 860 959",
		"FL": "239 305 321 324 352 386 407 448 561 645 656 689 727 728 754 772 786 813 850 863 904 941 954",
		"MD": "227 240 301 410 443 667",
		"MS": "228 601 662 769",
		"NJ": "201 551 609 640 732 848 856 862 908 973",
		"OK": "405 539 572 580 918",
		"TX": "210 214 254 281 325 346 361 409 430 432 469 512 682 713 726 737 806 817 830 832 903 915 936 940 945 956 972 979",
	} {
		for _, c := range strings.Fields(codes) {
			strictAreaCodes[c] = st
		}
	}
}

// usTerritories are the regions of the North American Numbering Plan that
// are US territories: the federal rule holds there, no state's.
var usTerritories = map[string]bool{"PR": true, "GU": true, "VI": true, "AS": true, "MP": true}

// stateNames maps the names the geocoder gives a US state to its code.
var stateNames = map[string]string{
	"Alabama": "AL", "Alaska": "AK", "Arizona": "AZ", "Arkansas": "AR", "California": "CA",
	"Colorado": "CO", "Connecticut": "CT", "Delaware": "DE", "Florida": "FL", "Georgia": "GA",
	"Hawaii": "HI", "Idaho": "ID", "Illinois": "IL", "Indiana": "IN", "Iowa": "IA",
	"Kansas": "KS", "Kentucky": "KY", "Louisiana": "LA", "Maine": "ME", "Maryland": "MD",
	"Massachusetts": "MA", "Michigan": "MI", "Minnesota": "MN", "Mississippi": "MS", "Missouri": "MO",
	"Montana": "MT", "Nebraska": "NE", "Nevada": "NV", "New Hampshire": "NH", "New Jersey": "NJ",
	"New Mexico": "NM", "New York": "NY", "North Carolina": "NC", "North Dakota": "ND", "Ohio": "OH",
	"Oklahoma": "OK", "Oregon": "OR", "Pennsylvania": "PA", "Rhode Island": "RI", "South Carolina": "SC",
	"South Dakota": "SD", "Tennessee": "TN", "Texas": "TX", "Utah": "UT", "Vermont": "VT",
	"Virginia": "VA", "Washington": "WA", "Washington State": "WA", "West Virginia": "WV", "Wisconsin": "WI",
	"Wyoming": "WY", "Washington D.C.": "DC", "District of Columbia": "DC",
}

// stateCodes are the codes of stateNames.
var stateCodes = map[string]bool{}

func init() {
	for _, c := range stateNames {
		stateCodes[c] = true
	}
}

// stateOf reads a geocoder's description of a US number: a state's name
// ("Florida", "Washington State") or a place in it ("San Francisco, CA");
// "" for anything else ("United States" for a toll-free number).
func stateOf(desc string) string {
	if c, ok := stateNames[desc]; ok {
		return c
	}
	if i := strings.LastIndex(desc, ", "); i >= 0 && stateCodes[desc[i+2:]] {
		return desc[i+2:]
	}
	return ""
}

// USStates returns where in the US the recipient of phone (E.164, e.g.
// "+13055550100") may be, as USPS codes: the state phonenumbers'
// GetGeocodingForNumber names ("FL"; "DC"), and the state of its area code
// too when that is another state with a rule of its own; a territory's
// code for a number there ("PR", "GU", "VI", "AS", "MP"). It returns nil
// when that is unknown: no number, one not in international form, outside
// the US, toll-free or not geocoded to a state. Safe for concurrent use;
// the first call loads the geocoder's data (about 13 MiB, 60 ms).
func USStates(phone string) []string {
	states, _ := usPlace(phone)
	return states
}

// usPlace returns USStates(phone) and the number's area code ("" when it
// is not a North American number).
func usPlace(phone string) (states []string, npa string) {
	phone = strings.TrimSpace(phone)
	if phone == "" {
		return nil, ""
	}
	defer func() {
		if recover() != nil { // odd input inside the library: unknown, not a crash
			states, npa = nil, ""
		}
	}()
	num, err := phonenumbers.Parse(phone, "")
	if err != nil || num.GetCountryCode() != 1 {
		return nil, ""
	}
	if nsn := phonenumbers.GetNationalSignificantNumber(num); len(nsn) == 10 {
		npa = nsn[:3]
	}
	region := phonenumbers.GetRegionCodeForNumber(num)
	if usTerritories[region] {
		return []string{region}, npa
	}
	if region != "US" {
		return nil, npa
	}
	desc, err := phonenumbers.GetGeocodingForNumber(num, "en")
	if err != nil {
		return nil, npa
	}
	st := stateOf(desc)
	if st == "" {
		return nil, npa
	}
	states = []string{st}
	if home, ok := strictAreaCodes[npa]; ok && home != st {
		states = append(states, home)
	}
	return states, npa
}
