package cluster

import (
	"strings"
	"testing"
	"time"
)

func TestCheckRatioSteps(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 1, 1, 0, 0, s, 0, time.UTC) }
	ch := func(r string, s int) RatioChange { return RatioChange{Ratio: r, Source: "usage", Changed: at(s)} }
	want := []string{"2", "1.5", "1"}
	for _, tc := range []struct {
		name    string
		changes []RatioChange
		err     string
	}{
		{"ok", []RatioChange{ch("2", 0), ch("1.5", 8), ch("1", 20)}, ""},
		{"too soon by the stamps", []RatioChange{ch("2", 0), ch("1.5", 7), ch("1", 20)}, "stamped 7s after"},
		{"too large a step", []RatioChange{ch("2", 0), ch("1", 9)}, "larger than"},
		{"missed a ratio", []RatioChange{ch("2", 0), ch("1.5", 9)}, "want [2 1.5 1]"},
		{"no stamp", []RatioChange{ch("2", 0), {Ratio: "1.5"}, ch("1", 30)}, "no stamp"},
	} {
		err := CheckRatioSteps(tc.changes, want, 500_000, 8*time.Second)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
	if got := FormatRatioSteps([]RatioChange{ch("2", 0), ch("1.5", 8)}); got != "2 (usage) → 1.5 (usage) +8s" {
		t.Errorf("FormatRatioSteps = %q", got)
	}
}
