// Package usageratio decides, for one node of one NodeOversell, the ratio
// per resource the webhook applies and why: spec.ratios, a ratio derived
// from the node's measured usage (spec.usage), a fallback without usable
// metrics, a pressure back-off, each moved with hysteresis, and never below
// what the node's running pods request (a cut is held, not enforced on
// them). It is a pure function of its inputs (Decide); the operator
// gathers them (internal/oversellnodes) and writes the result as the node's
// v1alpha1.OversellTarget annotation.
//
// The usage-derived ratio. With A the node's raw allocatable, U the usage
// of its pods (metrics.k8s.io), R their requests and T the target
// utilization, new pods are assumed to use what the present ones use per
// requested unit, L = U/R (1 when nothing is requested). Filling the node
// to an allocatable of A x r adds (A x r - R) of requests, so usage
// reaches U + (A x r - R) x L; keeping that at A x T gives
//
//	r = (A x T - U) / (L x A) + R / A
//
// (Katalyst's realtime ratio has the same form, with L clamped to [0.4,
// 1]; here L is only kept above 0.01, since the static ratio bounds r
// anyway, and a node using more than it requests gets L > 1). r is rounded
// down to 0.01, at least 1 and at most spec.ratios.
//
// Hysteresis (the katalyst-core #604 lesson: an unsmoothed ratio rises
// and falls with every sample): a ratio changes at most every
// MinChangeInterval, by at most MaxStep, and not at all for a usage target
// within DeadBand of the ratio in use. A lowered spec.ratios and the
// pressure back-off apply at once; the pods' floor always does.
//
// It must not import a client: inputs and outputs are values.
package usageratio

import (
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// NumResources is the number of amplified resources (oversell.CPU,
// oversell.Memory index the arrays).
const NumResources = 2

const (
	one      = 1_000_000 // a ratio of 1, in millionths
	maxRatio = 10 * one
	// usageStep is the granularity of a usage-derived ratio (0.01): finer
	// steps would only follow noise.
	usageStep = 10_000
	// minUsagePerRequest keeps L = U/R away from 0.
	minUsagePerRequest = 0.01
	// outOfRange is how far above capacity a usage may be before it is
	// taken as a broken measurement (a counter reset, a wrong unit).
	outOfRange = 1.1
)

// Config is a NodeOversell's spec.usage, parsed (ConfigFrom).
type Config struct {
	// Usage is false without spec.usage: the ratio is spec.ratios.
	Usage bool
	// TargetPercent per resource, 1..100.
	TargetPercent [NumResources]int32
	// MaxStep and DeadBand in millionths of a ratio.
	MaxStep, DeadBand int64
	// Fallback is the ratio without usable metrics.
	Fallback oversell.Ratio
	// MinChangeInterval, StaleAfter, PressureHold: see v1alpha1.OversellUsage.
	MinChangeInterval, StaleAfter, PressureHold time.Duration
	// PressurePercent per resource; 0 for none.
	PressurePercent [NumResources]int32
	// Interval is how often the operator evaluates.
	Interval time.Duration
}

// ConfigFrom parses no's spec.usage with its defaults; it returns an error
// naming the field for a value the CRD should have refused.
func ConfigFrom(no *v1alpha1.NodeOversell) (Config, error) {
	u := no.WithDefaults().Spec.Usage
	if u == nil {
		return Config{}, nil
	}
	c := Config{
		Usage:             true,
		TargetPercent:     [NumResources]int32{*u.TargetUtilization.CPU, *u.TargetUtilization.Memory},
		MinChangeInterval: u.MinChangeInterval.Duration,
		StaleAfter:        u.StaleAfter.Duration,
		PressureHold:      u.PressureHold.Duration,
		Interval:          u.Interval.Duration,
	}
	var err error
	if c.MaxStep, err = ParseStep(string(u.MaxStep)); err != nil || c.MaxStep == 0 {
		return Config{}, fmt.Errorf("spec.usage.maxStep %q: must be a decimal above 0 with at most 6 fractional digits", u.MaxStep)
	}
	if c.DeadBand, err = ParseStep(string(u.DeadBand)); err != nil {
		return Config{}, fmt.Errorf("spec.usage.deadBand %q: %w", u.DeadBand, err)
	}
	if c.Fallback, err = oversell.ParseRatio(string(u.FallbackRatio)); err != nil {
		return Config{}, fmt.Errorf("spec.usage.fallbackRatio: %w", err)
	}
	if p := u.PressureThreshold; p != nil {
		if p.CPU != nil {
			c.PressurePercent[oversell.CPU] = *p.CPU
		}
		if p.Memory != nil {
			c.PressurePercent[oversell.Memory] = *p.Memory
		}
	}
	return c, nil
}

// ParseStep parses a v1alpha1.RatioStep ("0.5", "1", "0.000001") into
// millionths.
func ParseStep(s string) (int64, error) {
	whole, frac, dot := strings.Cut(s, ".")
	if len(whole) != 1 || dot && (frac == "" || len(frac) > 6) {
		return 0, fmt.Errorf("must be a decimal from 0 to 9 with at most 6 fractional digits")
	}
	var v int64
	for _, ch := range whole + frac {
		if ch < '0' || ch > '9' {
			return 0, fmt.Errorf("must be a decimal from 0 to 9 with at most 6 fractional digits")
		}
		v = v*10 + int64(ch-'0')
	}
	for i := len(frac); i < 6; i++ {
		v *= 10
	}
	return v, nil
}

// Sample is one node's measurement.
type Sample struct {
	// Time of the measurement (the end of the metrics window).
	Time time.Time
	// Usage per resource: cpu in cores, memory in bytes, summed over the
	// node's pods.
	Usage [NumResources]resource.Quantity
	// Problem, when set, says why there is no usable measurement
	// ("metrics.k8s.io unavailable: ...", "no metrics for the node").
	Problem string
	// Outage, on a kept earlier sample, says why no newer one could be
	// read; the sample is used until it is stale.
	Outage string
}

// Input is everything one node's decision depends on.
type Input struct {
	// Now is the evaluation time.
	Now time.Time
	// Static is spec.ratios; an unset ratio leaves the resource alone.
	// Ceiling is the highest ratio the servers apply (Policy.Ceiling:
	// spec.ratios or status.ratioCeiling, whichever is larger).
	Static, Ceiling [NumResources]oversell.Ratio
	// Raw and Capacity per resource; Raw nil when the node has no
	// recorded raw allocatable yet (nothing is held then).
	Raw, Capacity [NumResources]*resource.Quantity
	// Exclusive is the cpu of exclusive CPUs (static CPU manager nodes).
	Exclusive resource.Quantity
	// Requests of the node's running pods per resource.
	Requests [NumResources]resource.Quantity
	// Sample is the node's measurement; nil without spec.usage.
	Sample *Sample
	// Prev is the node's target for this NodeOversell, nil if none.
	Prev *v1alpha1.OversellTarget
	// Leaving: the node no longer belongs to the NodeOversell (selector,
	// label, deletion); its target is raw, held while the pods need more.
	Leaving bool
}

// Decision is one node's outcome.
type Decision struct {
	// Target is the annotation to write (By is left for the caller).
	Target v1alpha1.OversellTarget
	// Ratio and Source per resource (unset Ratio: not amplified); Want
	// is the ratio aimed at before hysteresis and the pods' floor.
	Ratio  [NumResources]oversell.Ratio
	Source [NumResources]string
	Want   [NumResources]oversell.Ratio
	// Held names, per resource held above its target, the pods' requests
	// and what the target gives; Stranded what even the ceiling cannot give.
	Held, Stranded []string
	// Pressure is true while the node backs off.
	Pressure bool
	// Fallback says why metrics were not used ("" when they were).
	Fallback string
	// Taint is the value of our NoSchedule taint the node must carry:
	// v1alpha1.OversellTaintPressure, OversellTaintRatioCut or "" (none).
	Taint string
	// Release: the node is leaving and its pods fit the raw allocatable:
	// restore it.
	Release bool
	// Changed is true when a ratio differs from Prev's.
	Changed bool
}

// Decide computes one node's ratios. Properties (property_test.go): a
// ratio is never below 1, never above the ceiling, above spec.ratios only
// while held for the running pods (and then only as far as they need);
// on a steady input it converges and never moves again.
func Decide(c Config, in Input) Decision {
	var d Decision
	valid, why := sampleOK(c, in)
	pressure := c.Usage && c.pressure(in, valid, &d.Target)
	d.Pressure = pressure
	if c.Usage && !valid {
		d.Fallback = why
	}
	for r := range NumResources {
		static, ceiling := in.Static[r], in.Ceiling[r]
		if !ceiling.IsSet() || ceiling.Micro() < static.Micro() {
			ceiling = static
		}
		if !ceiling.IsSet() {
			continue // the resource is not amplified
		}
		prev, changed := prevRatio(in.Prev, r, static)
		want, src := c.want(in, r, valid, pressure)
		if !static.IsSet() {
			want = one // only the ceiling of an earlier spec is left
		}
		next := c.step(in, prev, want, src, changed, static)
		// The running pods' floor, within the ceiling.
		if in.Raw[r] != nil {
			need, ok := needRatio(r, *in.Raw[r], in.Capacity[r], in.Exclusive, in.Requests[r])
			if need > next {
				held := min(need, ceiling.Micro())
				d.Held = append(d.Held, fmt.Sprintf("%s: pods request %s > %s at %s",
					oversell.Resource(r), in.Requests[r].String(), allocAt(r, in, next), oversell.RatioMicro(next)))
				if !ok || need > ceiling.Micro() {
					d.Stranded = append(d.Stranded, fmt.Sprintf("%s: pods request %s > %s at the ceiling %s",
						oversell.Resource(r), in.Requests[r].String(), allocAt(r, in, ceiling.Micro()), ceiling))
				}
				next = held
			}
		}
		next = min(max(next, one), ceiling.Micro())
		ratio := oversell.RatioMicro(next)
		d.Ratio[r], d.Source[r] = ratio, src
		d.Want[r] = oversell.RatioMicro(want)
		rt := &v1alpha1.OversellResourceTarget{Ratio: ratio.String(), Source: src}
		if prev != next || in.Prev == nil {
			if prev != next {
				d.Changed = true
			}
			rt.Changed = in.Now.UTC().Format(time.RFC3339)
		} else if !changed.IsZero() {
			rt.Changed = changed.UTC().Format(time.RFC3339)
		}
		if r == int(oversell.CPU) {
			d.Target.CPU = rt
		} else {
			d.Target.Memory = rt
		}
	}
	if in.Exclusive.Sign() > 0 {
		d.Target.ExclusiveCPU = in.Exclusive.String()
	}
	d.Target.Held = strings.Join(d.Held, "; ")
	switch {
	case pressure:
		d.Taint = v1alpha1.OversellTaintPressure
	case len(d.Held) > 0:
		d.Taint = v1alpha1.OversellTaintRatioCut
	}
	d.Release = in.Leaving && len(d.Held) == 0
	return d
}

// want is the ratio resource r aims at before hysteresis, and its source.
func (c Config) want(in Input, r int, valid, pressure bool) (int64, string) {
	static := in.Static[r].Micro()
	switch {
	case in.Leaving:
		return one, v1alpha1.RatioSourceStatic
	case !c.Usage:
		return static, v1alpha1.RatioSourceStatic
	case pressure:
		return one, v1alpha1.RatioSourcePressure
	case !valid:
		return min(static, c.Fallback.Micro()), v1alpha1.RatioSourceFallback
	}
	u := usageRatio(in, r, c.TargetPercent[r])
	if u < static {
		return u, v1alpha1.RatioSourceUsage
	}
	return static, v1alpha1.RatioSourceStatic
}

// step moves prev toward want with hysteresis. Without spec.usage, when
// leaving, under pressure, and for a lowered spec.ratios, it jumps.
func (c Config) step(in Input, prev, want int64, src string, changed time.Time, static oversell.Ratio) int64 {
	if !c.Usage || in.Leaving || src == v1alpha1.RatioSourcePressure {
		return want
	}
	next := prev
	if s := static.Micro(); s > 0 && next > s {
		next = s // a lowered spec.ratios applies at once (the floor holds the pods)
	}
	diff := want - next
	if diff == 0 {
		return next
	}
	// The dead band keeps a usage target from nudging the ratio; the
	// bounds (1 and spec.ratios) are always reached.
	inside := want > one && want < static.Micro()
	if inside && abs(diff) < c.DeadBand {
		return next
	}
	if !changed.IsZero() && in.Now.Before(nextChange(changed, c.MinChangeInterval)) {
		return next
	}
	return next + max(min(diff, c.MaxStep), -c.MaxStep)
}

// nextChange is the earliest time a ratio stamped changed may move again
// (or a back-off whose usage fell below at changed may end). The stamp is
// RFC 3339 in whole seconds, so what it records happened up to a second
// after it: counting from the stamp alone let a change come up to a
// second early.
func nextChange(changed time.Time, interval time.Duration) time.Time {
	if interval <= 0 {
		return changed
	}
	return changed.Truncate(time.Second).Add(time.Second + interval)
}

// pressure runs the back-off state machine on the node's target: it
// starts when usage of any resource with a threshold crosses it, and ends
// once usage stayed below for PressureHold. Without a valid measurement
// the state is kept as it is.
func (c Config) pressure(in Input, valid bool, t *v1alpha1.OversellTarget) bool {
	var since, below string
	if in.Prev != nil {
		since, below = in.Prev.PressureSince, in.Prev.BelowSince
	}
	active := since != ""
	if !valid {
		t.PressureSince, t.BelowSince = since, below
		return active
	}
	over := false
	for r := range NumResources {
		pct := c.PressurePercent[r]
		if pct == 0 || in.Raw[r] == nil || in.Raw[r].Sign() <= 0 {
			continue
		}
		if in.Sample.Usage[r].AsApproximateFloat64() >= float64(pct)/100*in.Raw[r].AsApproximateFloat64() {
			over = true
		}
	}
	now := in.Now.UTC().Format(time.RFC3339)
	switch {
	case over:
		if !active {
			since = now
		}
		t.PressureSince, t.BelowSince = since, ""
		return true
	case !active:
		return false
	}
	if below == "" {
		below = now
	}
	if bt, err := time.Parse(time.RFC3339, below); err == nil && !in.Now.Before(nextChange(bt, c.PressureHold)) {
		return false // held long enough below: the back-off ends
	}
	t.PressureSince, t.BelowSince = since, below
	return true
}

// sampleOK says whether the node's measurement is usable, and why not.
func sampleOK(c Config, in Input) (bool, string) {
	if !c.Usage {
		return false, ""
	}
	s := in.Sample
	switch {
	case s == nil:
		return false, "no metrics for the node"
	case s.Problem != "":
		return false, s.Problem
	case in.Now.Sub(s.Time) > c.StaleAfter && s.Outage != "":
		return false, fmt.Sprintf("%s; the last metrics, from %s, are older than %s", s.Outage, s.Time.UTC().Format(time.RFC3339), c.StaleAfter)
	case in.Now.Sub(s.Time) > c.StaleAfter:
		return false, fmt.Sprintf("metrics from %s are older than %s", s.Time.UTC().Format(time.RFC3339), c.StaleAfter)
	}
	for r := range NumResources {
		u := s.Usage[r]
		limit := in.Capacity[r]
		if limit == nil {
			limit = in.Raw[r]
		}
		if u.Sign() < 0 {
			return false, fmt.Sprintf("%s usage %s is negative", oversell.Resource(r), u.String())
		}
		if limit != nil && u.AsApproximateFloat64() > outOfRange*limit.AsApproximateFloat64() {
			return false, fmt.Sprintf("%s usage %s is above the capacity %s", oversell.Resource(r), u.String(), limit.String())
		}
	}
	return true, ""
}

// usageRatio is the usage-derived ratio of resource r in millionths,
// rounded down to usageStep, within [1, 10].
func usageRatio(in Input, r int, pct int32) int64 {
	if in.Raw[r] == nil || in.Raw[r].Sign() <= 0 {
		return one
	}
	a := in.Raw[r].AsApproximateFloat64()
	u := in.Sample.Usage[r].AsApproximateFloat64()
	req := in.Requests[r].AsApproximateFloat64()
	l := 1.0
	if req > 0 {
		l = max(u/req, minUsagePerRequest)
	}
	x := (a*float64(pct)/100-u)/(l*a) + req/a
	if math.IsNaN(x) || x <= 1 {
		return one
	}
	if x >= 10 {
		return maxRatio
	}
	// The epsilon keeps float error (2.2/0.8 = 2.7499...) from losing a step.
	return max(int64(math.Floor(x*one/usageStep+1e-9))*usageStep, one)
}

// needRatio is the least ratio (millionths, rounded up) at which
// resource r's allocatable, (raw - G) x ratio + G for cpu, holds the
// requests; 1 when they fit the raw allocatable. ok is false when no
// ratio can (everything exclusive, or no raw).
func needRatio(r int, raw resource.Quantity, capacity *resource.Quantity, excl, req resource.Quantity) (int64, bool) {
	if req.Cmp(raw) <= 0 {
		return one, true
	}
	shared, num := raw.DeepCopy(), req.DeepCopy()
	if r == int(oversell.CPU) && excl.Sign() > 0 {
		g := excl.DeepCopy()
		if g.Cmp(raw) > 0 {
			g = raw.DeepCopy()
		}
		shared.Sub(g)
		num.Sub(g)
	}
	if shared.Sign() <= 0 {
		return maxRatio + 1, false
	}
	// ceil(num x 10^6 / shared), exactly, on the decimal values.
	q := new(big.Rat).Quo(decRat(num), decRat(shared))
	q.Mul(q, big.NewRat(one, 1))
	micro := new(big.Int).Quo(q.Num(), q.Denom())
	if new(big.Int).Mul(micro, q.Denom()).Cmp(q.Num()) != 0 {
		micro.Add(micro, big.NewInt(1))
	}
	if !micro.IsInt64() || micro.Int64() > maxRatio {
		return maxRatio + 1, false
	}
	m := micro.Int64()
	// Amplify rounds down to whole millicores or bytes: go up until the
	// published value really holds the requests.
	for i := 0; i < 1000 && m <= maxRatio; i++ {
		got := oversell.AmplifyExclusive(oversell.Resource(r), raw, capacity, oversell.RatioMicro(m), excl)
		if got.Cmp(req) >= 0 {
			return m, true
		}
		m++
	}
	return m, false
}

// decRat is q's exact value.
func decRat(q resource.Quantity) *big.Rat {
	d := q.AsDec()
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(int64(d.Scale())))), nil)
	if d.Scale() >= 0 {
		return new(big.Rat).SetFrac(d.UnscaledBig(), pow)
	}
	return new(big.Rat).SetInt(new(big.Int).Mul(d.UnscaledBig(), pow))
}

// allocAt is resource r's allocatable at ratio micro, for messages.
func allocAt(r int, in Input, micro int64) string {
	q := oversell.AmplifyExclusive(oversell.Resource(r), *in.Raw[r], in.Capacity[r], oversell.RatioMicro(micro), in.Exclusive)
	return q.String()
}

// prevRatio is the ratio in use from the node's target (spec.ratios
// without one) and when it last changed.
func prevRatio(p *v1alpha1.OversellTarget, r int, static oversell.Ratio) (int64, time.Time) {
	def := static.Micro()
	if def == 0 {
		def = one
	}
	if p == nil {
		return def, time.Time{}
	}
	rt := p.CPU
	if r == int(oversell.Memory) {
		rt = p.Memory
	}
	if rt == nil {
		return def, time.Time{}
	}
	x, err := oversell.ParseRatio(rt.Ratio)
	if err != nil {
		return def, time.Time{}
	}
	t, _ := time.Parse(time.RFC3339, rt.Changed)
	return x.Micro(), t
}

// UsageString formats a sample for a status message.
func UsageString(s *Sample) string {
	if s == nil {
		return "no sample"
	}
	if s.Problem != "" {
		return s.Problem
	}
	return fmt.Sprintf("cpu %s, memory %s at %s", s.Usage[oversell.CPU].String(), s.Usage[oversell.Memory].String(), s.Time.UTC().Format(time.RFC3339))
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
