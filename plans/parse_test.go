package plans_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/plans"
)

func TestParseQuietHours(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		want   plans.QuietHours
		canon  string
		wantOK bool
	}{
		{in: "21:00-08:00", want: plans.QuietHours{Start: 21 * 60, End: 8 * 60}, canon: "21:00-08:00", wantOK: true},
		{in: "21-8", want: plans.QuietHours{Start: 21 * 60, End: 8 * 60}, canon: "21:00-08:00", wantOK: true},
		{in: " 9:30 – 17 ", want: plans.QuietHours{Start: 9*60 + 30, End: 17 * 60}, canon: "09:30-17:00", wantOK: true},
		{in: "12:00-13:00", want: plans.QuietHours{Start: 12 * 60, End: 13 * 60}, canon: "12:00-13:00", wantOK: true},
		{in: "00:00-23:59", want: plans.QuietHours{Start: 0, End: 1439}, canon: "00:00-23:59", wantOK: true},
		{in: "22:00-24:00", want: plans.QuietHours{Start: 22 * 60, End: 0}, canon: "22:00-00:00", wantOK: true},
		{in: "22-24", want: plans.QuietHours{Start: 22 * 60, End: 0}, canon: "22:00-00:00", wantOK: true},
		{in: "02:15-06:00", want: plans.QuietHours{Start: 2*60 + 15, End: 6 * 60}, canon: "02:15-06:00", wantOK: true},
		{in: "23:59-00:00", want: plans.QuietHours{Start: 1439, End: 0}, canon: "23:59-00:00", wantOK: true},
	} {
		q, err := plans.ParseQuietHours(tc.in)
		if err != nil {
			t.Errorf("ParseQuietHours(%q): %v", tc.in, err)
			continue
		}
		if q != tc.want || q.String() != tc.canon {
			t.Errorf("ParseQuietHours(%q) = %#v %q, want %#v %q", tc.in, q, q, tc.want, tc.canon)
		}
		if err := q.Validate(); err != nil {
			t.Errorf("ParseQuietHours(%q) = %v, which does not validate: %v", tc.in, q, err)
		}
	}
}

func TestParseQuietHoursErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, mention string }{
		{"", "START-END"},
		{"21:00", "START-END"},
		{"21:00-08:00-09:00", "START-END"},
		{"21:00–08:00-09:00", "START-END"},
		{"25:00-08:00", `start "25:00": hour 25`},
		{"24:00-08:00", `start "24:00": hour 24`},
		{"21:00-24:30", `end "24:30": hour 24`},
		{"21:60-08:00", `start "21:60": minute 60`},
		{"21:00-08:5", `end "08:5": minutes must be two digits`},
		{"21:00-08:000", `end "08:000": minutes`},
		{"9pm-8am", `start "9pm"`},
		{"-1-8", `START-END`},
		{"21:00-", `end ""`},
		{"-08:00", `start ""`},
		{"123:00-08:00", `start "123:00"`},
		{"+1:00-08:00", `start "+1:00"`},
		{"21:00-08:00:00", `end "08:00:00"`},
		{"٢١:٠٠-08:00", `start "٢١:٠٠"`}, // Arabic-Indic digits are not ours
		{"08:00-08:00", "both 08:00"},
		{"0-24", "both 00:00"},
		{strings.Repeat("1", 100), "at most 64"},
	} {
		q, err := plans.ParseQuietHours(tc.in)
		if err == nil {
			t.Errorf("ParseQuietHours(%q) = %v, want an error", tc.in, q)
			continue
		}
		if !errors.Is(err, plans.ErrBadQuietHours) {
			t.Errorf("ParseQuietHours(%q): %v does not wrap ErrBadQuietHours", tc.in, err)
		}
		if !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("ParseQuietHours(%q): %q does not mention %q", tc.in, err, tc.mention)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		q       plans.QuietHours
		mention string // "" for valid
	}{
		{plans.QuietHours{Start: 21 * 60, End: 8 * 60}, ""},
		{plans.QuietHours{}, "both 00:00"},
		{plans.QuietHours{Start: -1, End: 8 * 60}, "start Clock(-1)"},
		{plans.QuietHours{Start: 60, End: 1440}, "end Clock(1440)"},
	} {
		err := tc.q.Validate()
		switch {
		case tc.mention == "" && err != nil:
			t.Errorf("%#v.Validate() = %v, want nil", tc.q, err)
		case tc.mention != "" && (!errors.Is(err, plans.ErrBadQuietHours) || !strings.Contains(err.Error(), tc.mention)):
			t.Errorf("%#v.Validate() = %v, want ErrBadQuietHours mentioning %q", tc.q, err, tc.mention)
		}
	}
}

func TestClock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    plans.Clock
		want string
	}{
		{plans.ClockAt(0, 0), "00:00"},
		{plans.ClockAt(8, 5), "08:05"},
		{plans.ClockAt(23, 59), "23:59"},
		{plans.ClockAt(24, 0), "Clock(1440)"},
		{-5, "Clock(-5)"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("Clock(%d).String() = %q, want %q", int(tc.c), got, tc.want)
		}
	}
}

func TestQuietHoursText(t *testing.T) {
	t.Parallel()
	var cfg struct{ Quiet plans.QuietHours }
	if err := json.Unmarshal([]byte(`{"Quiet": "21-8"}`), &cfg); err != nil {
		t.Fatal(err)
	}
	if want := (plans.QuietHours{Start: 21 * 60, End: 8 * 60}); cfg.Quiet != want {
		t.Fatalf("unmarshalled %#v, want %#v", cfg.Quiet, want)
	}
	out, err := json.Marshal(cfg)
	if err != nil || string(out) != `{"Quiet":"21:00-08:00"}` {
		t.Fatalf("json.Marshal = %s, %v", out, err)
	}
	err = json.Unmarshal([]byte(`{"Quiet": "21-21"}`), &cfg)
	if !errors.Is(err, plans.ErrBadQuietHours) {
		t.Fatalf("unmarshalling 21-21: %v, want ErrBadQuietHours", err)
	}
	if _, err := json.Marshal(struct{ Q plans.QuietHours }{}); !errors.Is(err, plans.ErrBadQuietHours) {
		t.Fatalf("marshalling the zero QuietHours: %v, want ErrBadQuietHours", err)
	}
}

func FuzzParseQuietHours(f *testing.F) {
	for _, s := range []string{"21:00-08:00", "21-8", "9pm-8am", "22-24", "24-1", "0-0", " 1:05 – 2 ",
		"12:00-13:00", "23:59-00:00", "21:00-08:00-09:00", "1:5-2", "99:99-99:99", "–", "-", "", "٢-٣", "\xff-1",
		"tcpa", " TCPA ", "tcpa-1", "t", "Tcpa\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := plans.ParseQuietHours(s)
		if err != nil {
			if !errors.Is(err, plans.ErrBadQuietHours) {
				t.Fatalf("ParseQuietHours(%q): error %v does not wrap ErrBadQuietHours", s, err)
			}
			return
		}
		if err := q.Validate(); err != nil {
			t.Fatalf("ParseQuietHours(%q) = %#v, which does not validate: %v", s, q, err)
		}
		back, err := plans.ParseQuietHours(q.String())
		if err != nil || back != q || back.String() != q.String() {
			t.Fatalf("round trip %q → %#v → %q → %#v, %v", s, q, q.String(), back, err)
		}
		var viaText plans.QuietHours
		if text, err := q.MarshalText(); err != nil || viaText.UnmarshalText(text) != nil || viaText != q {
			t.Fatalf("text round trip of %#v: %q, %v → %#v", q, text, err, viaText)
		}
	})
}
