package oversell

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Resource indexes the two resources the engine may inflate. Every other
// allocatable entry (pods, ephemeral-storage, hugepages-*, extended
// resources) is passed through untouched.
type Resource int

// The inflatable resources.
const (
	CPU Resource = iota
	Memory
	numResources
)

// resourceNames are the status.allocatable keys of the inflatable resources.
var resourceNames = [numResources]string{CPU: "cpu", Memory: "memory"}

// String returns the Kubernetes resource name ("cpu" or "memory").
func (r Resource) String() string { return resourceNames[r] }

// unitScale is the decimal scale results are rounded down to: whole
// millicores for cpu (10^-3) and whole bytes for memory (10^0).
func (r Resource) unitScale() inf.Scale {
	if r == CPU {
		return 3
	}
	return 0
}

// ratioScale is the number of fractional digits a ratio may carry; the API
// pattern allows at most 6.
const ratioScale = 6

// maxRatioMicro is 10 expressed in millionths, the API maximum.
const maxRatioMicro = 10_000_000

// Ratio is an amplification factor from 1 to 10 held exactly in millionths,
// so "1.5" is 1500000. The zero value means "not set".
type Ratio struct{ micro int64 }

// errInvalidRatio is returned by ParseRatio for anything outside the
// NodeOversell API's ratio grammar.
var errInvalidRatio = errors.New("ratio must be a decimal from 1 to 10 with at most 6 fractional digits")

// ParseRatio parses a decimal such as "2", "1.5" or "1.000001". It returns
// errInvalidRatio (wrapped) for values below 1, above 10, with more than 6
// fractional digits, signs, exponents or any other syntax. The API pattern
// in api/v1alpha1 already rejects these; the check is repeated because a
// heartbeat must never depend on the API server's validation.
func ParseRatio(s string) (Ratio, error) {
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" || len(intPart) > 2 || (hasDot && (frac == "" || len(frac) > ratioScale)) {
		return Ratio{}, fmt.Errorf("%w: %q", errInvalidRatio, s)
	}
	var v int64
	for _, c := range intPart + frac {
		if c < '0' || c > '9' {
			return Ratio{}, fmt.Errorf("%w: %q", errInvalidRatio, s)
		}
		v = v*10 + int64(c-'0')
	}
	for i := len(frac); i < ratioScale; i++ {
		v *= 10
	}
	if v < 1_000_000 || v > maxRatioMicro {
		return Ratio{}, fmt.Errorf("%w: %q", errInvalidRatio, s)
	}
	return Ratio{micro: v}, nil
}

// RatioMicro returns the ratio of micro millionths ("1.5" is 1500000),
// clamped to the API range 1..10; 0 is the unset ratio.
func RatioMicro(micro int64) Ratio {
	if micro == 0 {
		return Ratio{}
	}
	return Ratio{micro: min(max(micro, 1_000_000), maxRatioMicro)}
}

// Micro is the ratio in millionths; 0 when unset.
func (r Ratio) Micro() int64 { return r.micro }

// IsSet reports whether the ratio was given.
func (r Ratio) IsSet() bool { return r.micro != 0 }

// IsOne reports whether the ratio is exactly 1 (no inflation).
func (r Ratio) IsOne() bool { return r.micro == 1_000_000 }

// float returns the ratio as a float64, for metrics only.
func (r Ratio) float() float64 { return float64(r.micro) / 1e6 }

// String formats the ratio in its shortest exact decimal form ("2", "1.5").
func (r Ratio) String() string {
	s := strconv.FormatInt(r.micro/1_000_000, 10)
	frac := r.micro % 1_000_000
	if frac == 0 {
		return s
	}
	f := fmt.Sprintf("%06d", frac)
	return s + "." + strings.TrimRight(f, "0")
}

// dec returns the ratio as an exact inf.Dec.
func (r Ratio) dec() *inf.Dec { return inf.NewDec(r.micro, ratioScale) }

// Amplify returns raw × ratio for resource res, computed exactly on the
// decimal values (every quantity format works: "3800m", "16Gi", "16G",
// "1.5e9"), rounded down to whole millicores (cpu) or whole bytes (memory)
// and never below raw. When capacity is non-nil the result is never above
// capacity × ratio (an unset ratio counts as 1); that bound wins over "never
// below raw", since only a raw above capacity, which is not real, can hit
// it. The result is formatted like raw (cpu always decimal SI).
func Amplify(res Resource, raw resource.Quantity, capacity *resource.Quantity, r Ratio) resource.Quantity {
	if !r.IsSet() {
		r = Ratio{micro: 1_000_000}
	}
	rc := raw.DeepCopy()
	rawDec := rc.AsDec()
	var out *inf.Dec // nil: raw as is
	if !r.IsOne() {
		if prod := mulFloor(raw, r, res.unitScale()); prod.Cmp(rawDec) > 0 {
			out = prod
		}
	}
	if capacity != nil {
		cur := out
		if cur == nil {
			cur = rawDec
		}
		// Compared unrounded, so a raw equal to a capacity finer than the
		// unit is kept; rounded down only when it must be replaced.
		cc := capacity.DeepCopy()
		limit := new(inf.Dec).Mul(cc.AsDec(), r.dec())
		if cur.Cmp(limit) > 0 {
			out = limit.Round(limit, res.unitScale(), inf.RoundDown)
		}
	}
	if out == nil {
		return raw.DeepCopy()
	}
	format := raw.Format
	if res == CPU {
		format = resource.DecimalSI
	}
	return fromDec(out, format)
}

// mulFloor multiplies q by r and rounds toward zero at the given scale.
// Quantities are non-negative here (parseQuantity rejects negatives), so
// toward zero is down.
func mulFloor(q resource.Quantity, r Ratio, scale inf.Scale) *inf.Dec {
	d := q.AsDec() // q is a copy; AsDec converts the copy only
	prod := new(inf.Dec).Mul(d, r.dec())
	return prod.Round(prod, scale, inf.RoundDown)
}

// fromDec builds a Quantity, preferring the int64 form so String() yields
// canonical suffixes ("7600m", "24Gi").
func fromDec(d *inf.Dec, format resource.Format) resource.Quantity {
	if u, ok := d.Unscaled(); ok {
		switch d.Scale() {
		case 0:
			return *resource.NewQuantity(u, format)
		case 3:
			return *resource.NewMilliQuantity(u, format)
		}
	}
	return *resource.NewDecimalQuantity(*d, format)
}

// errNegative reports a negative allocatable or capacity, which the kubelet
// never produces and the engine refuses to scale.
var errNegative = errors.New("negative quantity")

// parseQuantity parses a status quantity, rejecting negative values.
func parseQuantity(s string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return q, err
	}
	if q.Sign() < 0 {
		return q, fmt.Errorf("%w: %q", errNegative, s)
	}
	return q, nil
}
