package usageratio

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func q(s string) resource.Quantity { return resource.MustParse(s) }
func qp(s string) *resource.Quantity {
	v := q(s)
	return &v
}
func ratio(s string) oversell.Ratio {
	r, err := oversell.ParseRatio(s)
	if err != nil {
		panic(err)
	}
	return r
}

func testConfig() Config {
	return Config{
		Usage: true, TargetPercent: [NumResources]int32{60, 80}, MaxStep: 500_000, DeadBand: 100_000,
		Fallback: ratio("1"), MinChangeInterval: time.Minute, StaleAfter: 3 * time.Minute, PressureHold: 2 * time.Minute,
		Interval: 10 * time.Second,
	}
}

// node4 is a 4-cpu / 16Gi node with spec cpu ratio 2, memory 1.
func node4(now time.Time, cpuUsage, cpuReq string) Input {
	return Input{
		Now:    now,
		Static: [NumResources]oversell.Ratio{ratio("2"), ratio("1")}, Ceiling: [NumResources]oversell.Ratio{ratio("2"), ratio("1")},
		Raw:      [NumResources]*resource.Quantity{qp("4"), qp("16Gi")},
		Capacity: [NumResources]*resource.Quantity{qp("4"), qp("16Gi")},
		Requests: [NumResources]resource.Quantity{q(cpuReq), q("1Gi")},
		Sample:   &Sample{Time: now, Usage: [NumResources]resource.Quantity{q(cpuUsage), q("1Gi")}},
	}
}

func TestConfigFromDefaults(t *testing.T) {
	c, err := ConfigFrom(&v1alpha1.NodeOversell{Spec: v1alpha1.NodeOversellSpec{Usage: &v1alpha1.OversellUsage{}}})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Usage: true, TargetPercent: [NumResources]int32{60, 80}, MaxStep: 500_000, DeadBand: 100_000,
		Fallback: ratio("1"), MinChangeInterval: 2 * time.Minute, StaleAfter: 3 * time.Minute, PressureHold: 2 * time.Minute, Interval: 30 * time.Second}
	if c != want {
		t.Fatalf("ConfigFrom = %+v, want %+v", c, want)
	}
	if _, err := ConfigFrom(&v1alpha1.NodeOversell{Spec: v1alpha1.NodeOversellSpec{Usage: &v1alpha1.OversellUsage{MaxStep: "0"}}}); err == nil {
		t.Fatal("maxStep 0 accepted")
	}
	if c, _ := ConfigFrom(&v1alpha1.NodeOversell{}); c.Usage {
		t.Fatal("no spec.usage is usage-aware")
	}
	u := &v1alpha1.OversellUsage{PressureThreshold: &v1alpha1.PressureThreshold{CPU: ptr(int32(90))}, Interval: &metav1.Duration{Duration: time.Second}}
	if c, _ := ConfigFrom(&v1alpha1.NodeOversell{Spec: v1alpha1.NodeOversellSpec{Usage: u}}); c.PressurePercent != [NumResources]int32{90, 0} || c.Interval != time.Second {
		t.Fatalf("pressure/interval: %+v", c)
	}
}

func ptr[T any](v T) *T { return &v }

func TestParseStep(t *testing.T) {
	for s, want := range map[string]int64{"0": 0, "0.5": 500_000, "1": 1_000_000, "2.25": 2_250_000, "0.000001": 1} {
		if got, err := ParseStep(s); err != nil || got != want {
			t.Errorf("ParseStep(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "10", "-1", "0.", ".5", "0.1234567", "a"} {
		if _, err := ParseStep(s); err == nil {
			t.Errorf("ParseStep(%q) accepted", s)
		}
	}
}

func TestUsageRatio(t *testing.T) {
	// Exact values of the formula.
	for _, tc := range []struct {
		usage, req string
		want       int64
	}{
		{"2", "4", 1_200_000},    // L=0.5: (2.4-2)/(2) + 1 = 1.2
		{"1", "4", 2_400_000},    // L=0.25: (2.4-1)/1 + 1 = 2.4
		{"3", "4", 1_000_000},    // (2.4-3)/3 + 1 = 0.8 -> 1
		{"0", "0", 1_000_000},    // 0.6 -> 1
		{"200m", "1", 3_000_000}, // (2.4-0.2)/0.8 + 0.25 = 3
		{"1200m", "2", 1_000_000},
	} {
		in := node4(t0, tc.usage, tc.req)
		if got := usageRatio(in, 0, 60); got != tc.want {
			t.Errorf("usage %s requests %s: %d, want %d", tc.usage, tc.req, got, tc.want)
		}
	}
}

// TestDecideTable covers one evaluation each.
func TestDecideTable(t *testing.T) {
	c := testConfig()
	prev := func(cpu, src string, changed time.Time) *v1alpha1.OversellTarget {
		return &v1alpha1.OversellTarget{By: "pool", CPU: &v1alpha1.OversellResourceTarget{Ratio: cpu, Source: src, Changed: changed.Format(time.RFC3339)},
			Memory: &v1alpha1.OversellResourceTarget{Ratio: "1", Source: "static"}}
	}
	for _, tc := range []struct {
		name   string
		cfg    Config
		in     func() Input
		cpu    string
		src    string
		taint  string
		held   string
		fallbk string
	}{
		{"no spec.usage: static", Config{}, func() Input { return node4(t0, "4", "4") }, "2", "static", "", "", ""},
		{"idle: static", c, func() Input { return node4(t0, "100m", "4") }, "2", "static", "", "", ""},
		{"busy: one step down", c, func() Input {
			in := node4(t0, "3", "4")
			in.Prev = prev("2", "static", t0.Add(-time.Hour))
			return in
		}, "1.5", "usage", "", "", ""},
		{"busy, changed recently: kept", c, func() Input {
			in := node4(t0, "3", "4")
			in.Prev = prev("2", "static", t0.Add(-time.Second))
			return in
		}, "2", "usage", "", "", ""},
		{"within the dead band: kept", c, func() Input {
			in := node4(t0, "1", "4") // wants 2.4 -> capped 2 ... use a middle target
			in.Requests[0] = q("5")
			in.Sample.Usage[0] = q("2200m") // L=0.44: (2.4-2.2)/1.76+1.25 = 1.36
			in.Prev = prev("1.4", "usage", t0.Add(-time.Hour))
			return in
		}, "1.4", "usage", "", "", ""},
		{"stale metrics: fallback, stepped", c, func() Input {
			in := node4(t0, "100m", "4")
			in.Sample.Time = t0.Add(-10 * time.Minute)
			in.Prev = prev("2", "static", t0.Add(-time.Hour))
			return in
		}, "1.5", "fallback", "", "", "older than"},
		{"no metrics: fallback", c, func() Input {
			in := node4(t0, "100m", "1")
			in.Sample = nil
			in.Prev = prev("1.5", "fallback", t0.Add(-time.Hour))
			return in
		}, "1", "fallback", "", "", "no metrics"},
		{"1000x capacity: fallback", c, func() Input {
			in := node4(t0, "4000", "1")
			in.Prev = prev("1.5", "usage", t0.Add(-time.Hour))
			return in
		}, "1", "fallback", "", "", "above the capacity"},
		{"negative usage: fallback", c, func() Input {
			in := node4(t0, "-1", "1")
			return in
		}, "1.5", "fallback", "", "", "negative"},
		{"metrics API down: fallback", c, func() Input {
			in := node4(t0, "0", "1")
			in.Sample.Problem = "metrics.k8s.io unavailable"
			in.Prev = prev("1", "fallback", t0.Add(-time.Hour))
			return in
		}, "1", "fallback", "", "", "unavailable"},
		{"fallback never above spec", Config{Usage: true, TargetPercent: c.TargetPercent, MaxStep: c.MaxStep, Fallback: ratio("5"), StaleAfter: time.Minute}, func() Input {
			in := node4(t0, "0", "1")
			in.Sample = nil
			return in
		}, "2", "fallback", "", "", "no metrics"},
		{"usage cut held for the pods", c, func() Input {
			in := node4(t0, "3", "6") // pods request 6 > 4 x 1.5 = 6? no: 6 fits 1.5
			in.Requests[0] = q("7")
			in.Sample.Usage[0] = q("3500m")
			in.Prev = prev("2", "static", t0.Add(-time.Hour))
			return in
		}, "1.75", "usage", "ratio-cut", "cpu: pods request 7 > 6 at 1.5", ""},
		{"pressure: 1 at once, tainted", withPressure(c, 90), func() Input {
			in := node4(t0, "3700m", "3")
			in.Prev = prev("2", "static", t0.Add(-time.Second))
			return in
		}, "1", "pressure", "pressure", "", ""},
		{"pressure with pods above raw: their floor", withPressure(c, 90), func() Input {
			in := node4(t0, "3700m", "5")
			in.Prev = prev("2", "static", t0.Add(-time.Second))
			return in
		}, "1.25", "pressure", "pressure", "cpu: pods request 5 > 4 at 1", ""},
		{"pressure kept until below for the hold", withPressure(c, 90), func() Input {
			in := node4(t0, "1", "3")
			in.Prev = prev("1", "pressure", t0.Add(-time.Hour))
			in.Prev.PressureSince, in.Prev.BelowSince = t0.Add(-time.Hour).Format(time.RFC3339), t0.Add(-time.Minute).Format(time.RFC3339)
			return in
		}, "1", "pressure", "pressure", "", ""},
		{"pressure ends after the hold: steps up", withPressure(c, 90), func() Input {
			in := node4(t0, "100m", "3")
			in.Prev = prev("1", "pressure", t0.Add(-time.Hour))
			in.Prev.PressureSince, in.Prev.BelowSince = t0.Add(-time.Hour).Format(time.RFC3339), t0.Add(-3*time.Minute).Format(time.RFC3339)
			return in
		}, "1.5", "static", "", "", ""},
		{"lowered spec: held at the pods' need", Config{}, func() Input {
			in := node4(t0, "0", "6")
			in.Static[0], in.Ceiling[0] = ratio("1"), ratio("2")
			in.Prev = prev("2", "static", t0)
			return in
		}, "1.5", "static", "ratio-cut", "cpu: pods request 6 > 4 at 1", ""},
		{"leaving, pods fit raw: released", Config{}, func() Input {
			in := node4(t0, "0", "3")
			in.Leaving = true
			return in
		}, "1", "static", "", "", ""},
		{"leaving, pods above raw: held", Config{}, func() Input {
			in := node4(t0, "0", "5")
			in.Leaving = true
			return in
		}, "1.25", "static", "ratio-cut", "cpu: pods request 5 > 4 at 1", ""},
		{"exclusive cpus in the floor", Config{}, func() Input {
			in := node4(t0, "0", "5")
			in.Static[0] = ratio("1")
			in.Exclusive = q("2") // (4-2) x r + 2 >= 5: r = 1.5
			return in
		}, "1.5", "static", "ratio-cut", "cpu: pods request 5 > 4 at 1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.cfg, tc.in())
			if got := d.Ratio[0].String(); got != tc.cpu || d.Source[0] != tc.src {
				t.Errorf("cpu %s (%s), want %s (%s); held %v fallback %q", got, d.Source[0], tc.cpu, tc.src, d.Held, d.Fallback)
			}
			if d.Taint != tc.taint {
				t.Errorf("taint %q, want %q", d.Taint, tc.taint)
			}
			if got := strings.Join(d.Held, "; "); got != tc.held {
				t.Errorf("held %q, want %q", got, tc.held)
			}
			if !strings.Contains(d.Fallback, tc.fallbk) || (tc.fallbk == "") != (d.Fallback == "") {
				t.Errorf("fallback %q, want %q", d.Fallback, tc.fallbk)
			}
			if d.Target.CPU == nil || d.Target.CPU.Ratio != tc.cpu {
				t.Errorf("target %+v", d.Target.CPU)
			}
		})
	}
	in := node4(t0, "0", "3")
	in.Leaving = true
	if !Decide(Config{}, in).Release {
		t.Error("leaving node whose pods fit is not released")
	}
}

func withPressure(c Config, pct int32) Config {
	c.PressurePercent[0] = pct
	return c
}

func TestNeedRatio(t *testing.T) {
	for _, tc := range []struct {
		raw, req, excl string
		want           int64
	}{
		{"4", "3", "0", one},
		{"4", "6", "0", 1_500_000},
		{"3", "4", "0", 1_333_334},
		{"1500m", "2", "0", 1_333_334},
		{"1500m", "2", "1", 2_000_000},
		{"16Gi", "20Gi", "0", 1_250_000},
	} {
		got, ok := needRatio(0, q(tc.raw), nil, q(tc.excl), q(tc.req))
		if !ok || got != tc.want {
			t.Errorf("need(%s, req %s, G %s) = %d %v, want %d", tc.raw, tc.req, tc.excl, got, ok, tc.want)
		}
		alloc := oversell.AmplifyExclusive(oversell.CPU, q(tc.raw), nil, oversell.RatioMicro(got), q(tc.excl))
		if alloc.Cmp(q(tc.req)) < 0 {
			t.Errorf("at the need %d allocatable %s < requests %s", got, alloc.String(), tc.req)
		}
	}
	if _, ok := needRatio(0, q("2"), nil, q("2"), q("3")); ok {
		t.Error("all-exclusive node can hold more")
	}
}

// TestTraceProperties runs Decide over simulated usage traces the way the
// operator does (its output is the next input's Prev), and checks after
// every step: the ratio is within [1, ceiling]; above spec.ratios only
// when held, and then no higher than the pods need; a change outside
// pressure and spec cuts moves at most MaxStep, at least MinChangeInterval
// after the previous one. On a steady trace the ratio never reverses
// direction and settles.
func TestTraceProperties(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		c := testConfig()
		c.MaxStep = int64(1+rng.IntN(10)) * 100_000
		c.DeadBand = int64(rng.IntN(3)) * 50_000
		c.MinChangeInterval = time.Duration(rng.IntN(4)) * 30 * time.Second
		if rng.IntN(2) == 0 {
			c.PressurePercent[0] = int32(70 + rng.IntN(30))
		}
		static := ratio([]string{"1", "1.5", "2", "3", "5"}[rng.IntN(5)])
		steady := rng.IntN(3) == 0
		raw := q(fmt.Sprintf("%d", 2+rng.IntN(14)))
		req := resource.NewMilliQuantity(int64(rng.IntN(int(raw.MilliValue()))), resource.DecimalSI)
		usage := resource.NewMilliQuantity(int64(rng.IntN(int(raw.MilliValue()))), resource.DecimalSI)
		var prev *v1alpha1.OversellTarget
		var ratios []int64
		lastChange := time.Time{}
		for step := 0; step < 600; step++ {
			now := t0.Add(time.Duration(step) * 10 * time.Second)
			if !steady && rng.IntN(5) == 0 {
				usage = resource.NewMilliQuantity(int64(rng.IntN(int(raw.MilliValue()))), resource.DecimalSI)
				if rng.IntN(4) == 0 {
					req = resource.NewMilliQuantity(int64(rng.IntN(int(2*raw.MilliValue()))), resource.DecimalSI)
				}
			}
			in := Input{
				Now: now, Static: [NumResources]oversell.Ratio{static, ratio("1")}, Ceiling: [NumResources]oversell.Ratio{static, ratio("1")},
				Raw: [NumResources]*resource.Quantity{&raw, qp("8Gi")}, Capacity: [NumResources]*resource.Quantity{&raw, qp("8Gi")},
				Requests: [NumResources]resource.Quantity{*req, q("1Gi")},
				Sample:   &Sample{Time: now, Usage: [NumResources]resource.Quantity{*usage, q("1Gi")}},
				Prev:     prev,
			}
			if !steady && rng.IntN(20) == 0 {
				in.Sample = nil
			}
			d := Decide(c, in)
			r := d.Ratio[0].Micro()
			need, _ := needRatio(0, raw, &raw, resource.Quantity{}, *req)
			if r < one || r > static.Micro() && (len(d.Held) == 0 || r > need) {
				t.Fatalf("seed %d step %d: ratio %d outside [1, %d] (held %v, need %d)", seed, step, r, static.Micro(), d.Held, need)
			}
			if len(ratios) > 0 && r != ratios[len(ratios)-1] {
				p := ratios[len(ratios)-1]
				if d.Source[0] != v1alpha1.RatioSourcePressure && len(d.Held) == 0 && !d.Pressure && prev != nil && prev.CPU.Source != v1alpha1.RatioSourcePressure {
					if abs(r-p) > c.MaxStep {
						t.Fatalf("seed %d step %d: moved %d -> %d, more than %d", seed, step, p, r, c.MaxStep)
					}
					if !lastChange.IsZero() && now.Sub(lastChange) < c.MinChangeInterval {
						t.Fatalf("seed %d step %d: changed %s after the previous change", seed, step, now.Sub(lastChange))
					}
				}
				lastChange = now
			}
			ratios = append(ratios, r)
			t2 := d.Target
			t2.By = "pool"
			prev = &t2
		}
		if steady {
			dir := int64(0)
			for i := 1; i < len(ratios); i++ {
				dlt := ratios[i] - ratios[i-1]
				if dlt != 0 && dir != 0 && (dlt > 0) != (dir > 0) {
					t.Fatalf("seed %d: steady trace reversed at step %d: %v", seed, i, ratios[:i+1])
				}
				if dlt != 0 {
					dir = dlt
				}
			}
			if tail := ratios[len(ratios)-20:]; tail[0] != tail[len(tail)-1] {
				t.Fatalf("seed %d: steady trace still moving at the end: %v", seed, tail)
			}
		}
	}
}

// TestRiseAndFall: usage rising lowers the ratio within the hysteresis
// bounds, and falling raises it back to spec.ratios.
func TestRiseAndFall(t *testing.T) {
	c := testConfig()
	var prev *v1alpha1.OversellTarget
	run := func(from time.Time, usage string, n int) (time.Time, oversell.Ratio) {
		var r oversell.Ratio
		for i := 0; i < n; i++ {
			in := node4(from, usage, "3")
			in.Prev = prev
			d := Decide(c, in)
			t2 := d.Target
			prev = &t2
			r = d.Ratio[0]
			from = from.Add(10 * time.Second)
		}
		return from, r
	}
	now, r := run(t0, "100m", 3)
	if r.String() != "2" {
		t.Fatalf("idle: %s", r)
	}
	now, r = run(now, "2700m", 30)
	if r.String() != "1" {
		t.Fatalf("busy after 5 min: %s", r)
	}
	_, r = run(now, "100m", 30)
	if r.String() != "2" {
		t.Fatalf("idle again after 5 min: %s", r)
	}
}

// TestMinChangeIntervalRealTime runs Decide the way the operator does, at
// real (sub-second) evaluation times with its output round-tripped through
// the node annotation's JSON (whole-second RFC 3339 stamps), from the
// NodeOversell's creation on. Every ratio change outside pressure, spec
// cuts and holds comes at least MinChangeInterval of real time after the
// previous one, the creation's first write included (issue 27: a stamp
// truncated to the second let a change come up to a second early).
func TestMinChangeIntervalRealTime(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 27))
		c := testConfig()
		c.MinChangeInterval = time.Duration(1+rng.IntN(20)) * time.Second
		c.DeadBand = 0
		c.Interval = time.Duration(500+rng.IntN(2500)) * time.Millisecond
		// Creation at any instant within a second.
		now := t0.Add(time.Duration(rng.Int64N(int64(time.Hour))))
		usage := "100m"
		var prev *v1alpha1.OversellTarget
		var last time.Time
		var lastRatio string
		for step := 0; step < 400; step++ {
			if rng.IntN(6) == 0 {
				usage = fmt.Sprintf("%dm", 100+rng.IntN(3900))
			}
			in := node4(now, usage, "4")
			in.Requests[0] = q("1") // the pods' floor stays below every ratio
			in.Prev = prev
			d := Decide(c, in)
			r := d.Ratio[0].String()
			if d.Source[0] == v1alpha1.RatioSourcePressure || len(d.Held) > 0 {
				t.Fatalf("seed %d: the trace should neither press nor hold: %+v", seed, d)
			}
			if r != lastRatio {
				if !last.IsZero() && now.Sub(last) < c.MinChangeInterval {
					t.Fatalf("seed %d step %d: %s -> %s %s after the previous change (minChangeInterval %s)",
						seed, step, lastRatio, r, now.Sub(last), c.MinChangeInterval)
				}
				last, lastRatio = now, r
			}
			prev = roundTrip(t, d.Target)
			// The next pass: the interval, late by up to a second of load.
			now = now.Add(c.Interval + time.Duration(rng.Int64N(int64(time.Second))))
		}
	}
}

// roundTrip is the target annotation's JSON round trip, as the operator
// reads back what it wrote.
func roundTrip(t *testing.T, tg v1alpha1.OversellTarget) *v1alpha1.OversellTarget {
	t.Helper()
	b, err := json.Marshal(tg)
	if err != nil {
		t.Fatal(err)
	}
	out := &v1alpha1.OversellTarget{}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNextChange: a whole-second stamp counts from the end of its second;
// no interval, no wait.
func TestNextChange(t *testing.T) {
	stamp := t0.Add(5 * time.Second)
	if got, want := nextChange(stamp, 8*time.Second), t0.Add(14*time.Second); !got.Equal(want) {
		t.Fatalf("nextChange = %s, want %s", got, want)
	}
	if got := nextChange(stamp.Add(300*time.Millisecond), 8*time.Second); !got.Equal(t0.Add(14 * time.Second)) {
		t.Fatalf("a fractional stamp: %s", got)
	}
	if got := nextChange(stamp, 0); !got.Equal(stamp) {
		t.Fatalf("no interval: %s", got)
	}
}

// TestPressureHoldRealTime: at real evaluation times with the annotation's
// round trip, a back-off ends no sooner than PressureHold of real time
// after the first evaluation that saw usage below the threshold.
func TestPressureHoldRealTime(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 28))
		c := withPressure(testConfig(), 90)
		c.PressureHold = time.Duration(1+rng.IntN(20)) * time.Second
		c.Interval = time.Duration(500+rng.IntN(2500)) * time.Millisecond
		now := t0.Add(time.Duration(rng.Int64N(int64(time.Hour))))
		var prev *v1alpha1.OversellTarget
		var below time.Time
		pressed := false
		for step := 0; step < 200; step++ {
			usage := "100m"
			if step%50 < 5 {
				usage = "3900m" // over 90 % of 4
			}
			in := node4(now, usage, "1")
			in.Prev = prev
			d := Decide(c, in)
			switch {
			case d.Pressure:
				if usage == "100m" && below.IsZero() {
					below = now
				}
				if usage != "100m" {
					below = time.Time{}
				}
				pressed = true
			case pressed:
				if now.Sub(below) < c.PressureHold {
					t.Fatalf("seed %d step %d: back-off ended %s after usage fell (hold %s)", seed, step, now.Sub(below), c.PressureHold)
				}
				pressed, below = false, time.Time{}
			}
			prev = roundTrip(t, d.Target)
			now = now.Add(c.Interval + time.Duration(rng.Int64N(int64(time.Second))))
		}
	}
}
