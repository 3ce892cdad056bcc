package oversell

import (
	"errors"
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

const (
	annRaw     = v1alpha1.OversellRawAllocatableKey
	annRatios  = v1alpha1.OversellRatiosKey
	annApplied = v1alpha1.OversellAppliedByKey
)

func policy(name, cpu, mem string) *Policy {
	p := &Policy{Name: name, Selector: labels.Everything()}
	if cpu != "" {
		p.Ratios[CPU] = mustRatio(cpu)
	}
	if mem != "" {
		p.Ratios[Memory] = mustRatio(mem)
	}
	return p
}

func mustRatio(s string) Ratio {
	r, err := ParseRatio(s)
	if err != nil {
		panic(err)
	}
	return r
}

// node builds a NodeState with capacity cpu=4, memory=16Gi (unless given)
// and the given allocatable and annotations.
func node(cpu, mem string, ann map[string]string) NodeState {
	return NodeState{
		Labels:      map[string]string{"pool": "oversell"},
		Annotations: ann,
		Capacity:    map[string]string{"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi", "hugepages-2Mi": "0"},
		Allocatable: map[string]string{"cpu": cpu, "memory": mem, "pods": "110", "ephemeral-storage": "95Gi", "hugepages-2Mi": "0"},
	}
}

// amplifiedAnn are the annotations after amplifying raw 3800m/15Gi by 2/1.5.
func amplifiedAnn() map[string]string {
	return map[string]string{
		"other":    "kept",
		annRaw:     `{"cpu":"3800m","memory":"15Gi"}`,
		annRatios:  `{"cpu":"2","memory":"1.5"}`,
		annApplied: "oversell-pool",
	}
}

// emptyBookkeeping is what a write without allocatable used to record.
func emptyBookkeeping() map[string]string {
	return map[string]string{"other": "kept", annRaw: "{}", annRatios: "{}", annApplied: "oversell-pool"}
}

func with(m map[string]string, kv ...string) map[string]string {
	m = maps.Clone(m)
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "-" {
			delete(m, kv[i])
		} else {
			m[kv[i]] = kv[i+1]
		}
	}
	return m
}

func ref[T any](v T) *T { return &v }

func TestDecide(t *testing.T) {
	pool := policy("oversell-pool", "2", "1.5")
	amplified := node("7600m", "23040Mi", amplifiedAnn())
	plain := node("3800m", "15Gi", map[string]string{"other": "kept"})

	type want struct {
		apply     bool
		reason    Reason
		restore   bool
		cpu, mem  string // effective allocatable
		raw       string // raw annotation
		ratios    string
		appliedBy string
		untrusted bool
	}
	cases := []struct {
		name string
		in   Input
		want want
	}{
		{
			name: "first amplification by the kubelet",
			in:   Input{Writer: writerKubelet, Object: plain, Old: &plain, Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "first amplification by another writer adopts the unamplified value",
			in:   Input{Writer: WriterOther, Object: plain, Old: &plain, Policy: pool},
			want: want{apply: true, reason: reasonAdopted, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "kubelet heartbeat with unchanged real value",
			in:   Input{Writer: writerKubelet, Object: node("3800m", "15Gi", amplifiedAnn()), Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "kubelet reports a new real value (reservations changed)",
			in:   Input{Writer: writerKubelet, Object: node("3500m", "14Gi", amplifiedAnn()), Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7", mem: "21Gi",
				raw: `{"cpu":"3500m","memory":"14Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "kubelet patch from a stale copy leaves the amplified value: raw kept",
			in:   Input{Writer: writerKubelet, Object: amplified, Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonStaleReport, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "trusted reporter counts as raw",
			in:   Input{Writer: writerTrusted, Object: node("3000m", "15Gi", amplifiedAnn()), Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonTrustedReport, cpu: "6", mem: "23040Mi",
				raw: `{"cpu":"3","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "another writer patches only conditions: no compounding",
			in:   Input{Writer: WriterOther, Object: amplified, Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonAnnotation, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "another writer writes a stale raw value back",
			in:   Input{Writer: WriterOther, Object: node("3800m", "15Gi", amplifiedAnn()), Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonAnnotation, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool", untrusted: true},
		},
		{
			name: "another writer writes a doubled value: published value restored",
			in:   Input{Writer: WriterOther, Object: node("15200m", "46080Mi", amplifiedAnn()), Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonAnnotation, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool", untrusted: true},
		},
		{
			name: "another writer cannot inject a raw annotation",
			in: Input{Writer: WriterOther, Object: node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"100","memory":"1Ti"}`)),
				Old: &amplified, Policy: pool},
			want: want{apply: true, reason: reasonAnnotation, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "ratio raised, kubelet write",
			in:   Input{Writer: writerKubelet, Object: node("3800m", "15Gi", amplifiedAnn()), Old: &amplified, Policy: policy("oversell-pool", "3", "2")},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "11400m", mem: "30Gi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"3","memory":"2"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "ratio raised, operator resync write",
			in:   Input{Writer: WriterOther, Object: node("7600m", "23040Mi", with(amplifiedAnn(), v1alpha1.OversellResyncKey, "1")), Old: &amplified, Policy: policy("oversell-pool", "3", "2")},
			want: want{apply: true, reason: reasonAnnotation, cpu: "11400m", mem: "30Gi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"3","memory":"2"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "ratio lowered",
			in:   Input{Writer: WriterOther, Object: amplified, Old: &amplified, Policy: policy("oversell-pool", "1.5", "1.25")},
			want: want{apply: true, reason: reasonAnnotation, cpu: "5700m", mem: "19200Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"1.5","memory":"1.25"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "ratio 1.0 publishes raw and keeps bookkeeping",
			in:   Input{Writer: writerKubelet, Object: node("3800m", "15Gi", amplifiedAnn()), Old: &amplified, Policy: policy("oversell-pool", "1.0", "1")},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "3800m", mem: "15Gi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"1","memory":"1"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "cpu-only ratio restores memory to raw",
			in:   Input{Writer: WriterOther, Object: amplified, Old: &amplified, Policy: policy("cpu-only", "2", "")},
			want: want{apply: true, reason: reasonAnnotation, cpu: "7600m", mem: "15Gi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2"}`, appliedBy: "cpu-only"},
		},
		{
			name: "deselected: another writer's write restores raw",
			in:   Input{Writer: WriterOther, Object: amplified, Old: &amplified},
			want: want{apply: true, reason: reasonDeselected, restore: true, cpu: "3800m", mem: "15Gi"},
		},
		{
			name: "deselected: kubelet write restores its value",
			in:   Input{Writer: writerKubelet, Object: node("3700m", "15Gi", amplifiedAnn()), Old: &amplified},
			want: want{apply: true, reason: reasonDeselected, restore: true, cpu: "3700m", mem: "15Gi"},
		},
		{
			name: "deselected node hit by a full write of an old amplified copy: raw from the copy's bookkeeping",
			in:   Input{Writer: WriterOther, Object: amplified, Old: &plain},
			want: want{apply: true, reason: reasonDeselected, restore: true, cpu: "3800m", mem: "15Gi", untrusted: true},
		},
		{
			name: "selected node hit by a full write of an old amplified copy: no compounding",
			in:   Input{Writer: WriterOther, Object: amplified, Old: &plain, Policy: pool},
			want: want{apply: true, reason: reasonAnnotation, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool", untrusted: true},
		},
		{
			name: "never selected: nothing to do",
			in:   Input{Writer: writerKubelet, Object: plain, Old: &plain},
			want: want{reason: reasonNotSelected},
		},
		{
			name: "raw annotation missing, another writer: no safe decision",
			in:   Input{Writer: WriterOther, Object: amplified, Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, "-"))), Policy: pool},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "raw annotation corrupt, another writer: no safe decision",
			in:   Input{Writer: WriterOther, Object: amplified, Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"3800m",`))), Policy: pool},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "raw annotation has a corrupt quantity, another writer: no safe decision",
			in:   Input{Writer: WriterOther, Object: amplified, Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"lots","memory":"15Gi"}`))), Policy: pool},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "raw annotation corrupt, deselected, another writer: annotations kept as evidence",
			in:   Input{Writer: WriterOther, Object: amplified, Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, "garbage")))},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "raw annotation corrupt, kubelet write repairs it",
			in: Input{Writer: writerKubelet, Object: node("3800m", "15Gi", with(amplifiedAnn(), annRaw, "garbage")),
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, "garbage"))), Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "recorded raw above capacity × ratio, another writer: not trusted (no 1e30 published)",
			in: Input{Writer: WriterOther, Object: amplified,
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"3800m","memory":"1e30"}`))), Policy: pool},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "recorded raw above capacity but within capacity × ratio, another writer: not trusted",
			in: Input{Writer: WriterOther, Object: amplified,
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"5","memory":"15Gi"}`))), Policy: pool},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "recorded raw zero under a non-zero capacity, another writer: not trusted",
			in: Input{Writer: WriterOther, Object: amplified,
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"3800m","memory":"0"}`))), Policy: pool},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "recorded raw negative, another writer: not trusted",
			in: Input{Writer: WriterOther, Object: amplified,
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"-1","memory":"15Gi"}`))), Policy: pool},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "recorded raw without a capacity to bound it, another writer: not trusted",
			in: func() Input {
				n := node("7600m", "23040Mi", amplifiedAnn())
				delete(n.Capacity, "memory")
				return Input{Writer: WriterOther, Object: n, Old: &n, Policy: pool}
			}(),
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "recorded raw equal to capacity is plausible",
			in: Input{Writer: WriterOther, Object: amplified,
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"4","memory":"16Gi"}`))), Policy: pool},
			want: want{apply: true, reason: reasonAnnotation, cpu: "8", mem: "24Gi",
				raw: `{"cpu":"4","memory":"16Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "recorded raw above capacity, deselected, another writer: not restored",
			in: Input{Writer: WriterOther, Object: amplified,
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"3800m","memory":"1e30"}`)))},
			want: want{reason: reasonRawUnknown},
		},
		{
			name: "recorded raw above capacity, kubelet write replaces it",
			in: Input{Writer: writerKubelet, Object: node("3800m", "15Gi", with(amplifiedAnn(), annRaw, `{"cpu":"3800m","memory":"1e30"}`)),
				Old: ref(node("7600m", "23040Mi", with(amplifiedAnn(), annRaw, `{"cpu":"3800m","memory":"1e30"}`))), Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "another writer's value above capacity on a never amplified node is not adopted",
			in:   Input{Writer: WriterOther, Object: node("3800m", "1e30", nil), Old: &plain, Policy: pool},
			want: want{reason: reasonRawUnknown, untrusted: true},
		},
		{
			name: "another writer's zero value on a never amplified node is not adopted",
			in:   Input{Writer: WriterOther, Object: node("0", "15Gi", nil), Old: &plain, Policy: pool},
			want: want{reason: reasonRawUnknown, untrusted: true},
		},
		{
			name: "deselected: kubelet value above capacity restored as capacity",
			in:   Input{Writer: writerKubelet, Object: node("5", "15Gi", amplifiedAnn()), Old: &amplified},
			want: want{apply: true, reason: reasonDeselected, restore: true, cpu: "4", mem: "15Gi"},
		},
		{
			name: "kubelet write with no allocatable records nothing",
			in: func() Input {
				n := node("3800m", "15Gi", map[string]string{"other": "kept"})
				n.Allocatable = nil
				return Input{Writer: writerKubelet, Object: n, Old: &plain, Policy: pool}
			}(),
			want: want{reason: reasonNoAllocatable},
		},
		{
			name: "kubelet write with allocatable but no cpu or memory records nothing",
			in: func() Input {
				n := node("3800m", "15Gi", nil)
				n.Allocatable = map[string]string{"pods": "110"}
				return Input{Writer: writerKubelet, Object: n, Old: &plain, Policy: pool}
			}(),
			want: want{reason: reasonNoAllocatable},
		},
		{
			name: "empty raw annotation counts as absent: another writer's value adopted",
			in: Input{Writer: WriterOther, Object: node("3800m", "15Gi", emptyBookkeeping()),
				Old: ref(node("3800m", "15Gi", emptyBookkeeping())), Policy: pool},
			want: want{apply: true, reason: reasonAdopted, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "empty raw annotation, deselected: nothing to restore",
			in:   Input{Writer: WriterOther, Object: node("3800m", "15Gi", emptyBookkeeping()), Old: ref(node("3800m", "15Gi", emptyBookkeeping()))},
			want: want{reason: reasonNotSelected},
		},
		{
			name: "invalid incoming quantity: no decision",
			in:   Input{Writer: writerKubelet, Object: node("many", "15Gi", nil), Old: &plain, Policy: pool},
			want: want{reason: reasonInvalidQuantity},
		},
		{
			name: "odd formats: decimal cores and exponent bytes",
			in:   Input{Writer: writerKubelet, Object: node("3.8", "1.5e9", nil), Old: &plain, Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "2250e6",
				raw: `{"cpu":"3800m","memory":"1500e6"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "odd formats: decimal SI memory",
			in:   Input{Writer: writerKubelet, Object: node("3800m", "16G", nil), Old: &plain, Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "24G",
				raw: `{"cpu":"3800m","memory":"16G"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "memory in plain bytes",
			in:   Input{Writer: writerKubelet, Object: node("3800m", "16106127360", nil), Old: &plain, Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "24159191040",
				raw: `{"cpu":"3800m","memory":"16106127360"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "memory in Ki (same value as the bytes case)",
			in:   Input{Writer: writerKubelet, Object: node("3800m", "15728640Ki", nil), Old: &plain, Policy: pool},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "7600m", mem: "23040Mi",
				raw: `{"cpu":"3800m","memory":"15Gi"}`, ratios: `{"cpu":"2","memory":"1.5"}`, appliedBy: "oversell-pool"},
		},
		{
			name: "rounded down to whole millicores and bytes",
			in:   Input{Writer: writerKubelet, Object: node("3333m", "1001", nil), Old: &plain, Policy: policy("p", "1.5", "1.5")},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "4999m", mem: "1501",
				raw: `{"cpu":"3333m","memory":"1001"}`, ratios: `{"cpu":"1.5","memory":"1.5"}`, appliedBy: "p"},
		},
		{
			name: "capped at capacity × ratio",
			in:   Input{Writer: writerKubelet, Object: node("4", "20Gi", nil), Old: &plain, Policy: policy("p", "2", "2")},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "8", mem: "32Gi",
				raw: `{"cpu":"4","memory":"20Gi"}`, ratios: `{"cpu":"2","memory":"2"}`, appliedBy: "p"},
		},
		{
			name: "sub-millicore raw never published below raw",
			in:   Input{Writer: writerKubelet, Object: node("1500u", "15Gi", nil), Old: &plain, Policy: policy("p", "1.000001", "")},
			want: want{apply: true, reason: reasonKubeletReport, cpu: "1500u", mem: "15Gi",
				raw: `{"cpu":"1500u","memory":"15Gi"}`, ratios: `{"cpu":"1.000001"}`, appliedBy: "p"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if d.Apply != tc.want.apply || d.Reason != tc.want.reason || d.Restore != tc.want.restore || d.UntrustedAllocatableWrite != tc.want.untrusted {
				t.Fatalf("apply=%v reason=%q restore=%v untrusted=%v; want %v %q %v %v",
					d.Apply, d.Reason, d.Restore, d.UntrustedAllocatableWrite, tc.want.apply, tc.want.reason, tc.want.restore, tc.want.untrusted)
			}
			if !d.Apply {
				return
			}
			if got := d.Effective[CPU].String(); got != tc.want.cpu {
				t.Errorf("cpu = %s, want %s", got, tc.want.cpu)
			}
			if got := d.Effective[Memory].String(); got != tc.want.mem {
				t.Errorf("memory = %s, want %s", got, tc.want.mem)
			}
			if d.Annotations != [3]string{tc.want.raw, tc.want.ratios, tc.want.appliedBy} {
				t.Errorf("annotations = %q, want %q", d.Annotations, [3]string{tc.want.raw, tc.want.ratios, tc.want.appliedBy})
			}
		})
	}
}

func TestClassifyWriter(t *testing.T) {
	trusted := func(u string) bool { return u == "harness" }
	cases := []struct {
		user   string
		groups []string
		want   WriterClass
	}{
		{"system:node:n1", []string{"system:nodes", "system:authenticated"}, writerKubelet},
		{"system:node:n1", []string{"system:authenticated"}, WriterOther},
		{"system:node:n2", []string{"system:nodes"}, WriterOther},
		{"system:node:n1x", []string{"system:nodes"}, WriterOther},
		{"harness", nil, writerTrusted},
		{"admin", []string{"system:masters"}, WriterOther},
	}
	for _, c := range cases {
		if got := classifyWriter("n1", c.user, c.groups, trusted); got != c.want {
			t.Errorf("%s %v = %v, want %v", c.user, c.groups, got, c.want)
		}
	}
}

func TestParseRatio(t *testing.T) {
	good := map[string]string{"1": "1", "1.0": "1", "1.5": "1.5", "2": "2", "9.999999": "9.999999", "10": "10", "10.000000": "10", "1.000001": "1.000001"}
	for in, want := range good {
		r, err := ParseRatio(in)
		if err != nil || r.String() != want {
			t.Errorf("ParseRatio(%q) = %v, %v; want %s", in, r, err, want)
		}
	}
	for _, in := range []string{"", "0", "0.5", "0.999999", "10.000001", "11", "100", "1.", ".5", "1.0000001", "-1", "+2", "1e1", "2 ", "1,5", "NaN"} {
		if _, err := ParseRatio(in); !errors.Is(err, errInvalidRatio) {
			t.Errorf("ParseRatio(%q) error = %v, want ErrInvalidRatio", in, err)
		}
	}
}

func TestAmplifyBounds(t *testing.T) {
	cap4 := resource.MustParse("4")
	cap1n := resource.MustParse("1n")
	for _, c := range []struct {
		raw   string
		cap   *resource.Quantity
		ratio string
		want  string
	}{
		{"3800m", &cap4, "2", "7600m"},
		{"3800m", &cap4, "10", "38"},
		{"5", &cap4, "2", "8"},      // raw above capacity: capped at capacity × ratio
		{"9", &cap4, "1.5", "6"},    // raw above capacity × ratio: the bound wins over "never below raw"
		{"5", &cap4, "1", "4"},      // ratio 1 is bounded by capacity too
		{"5", &cap4, "", "4"},       // unset ratio counts as 1
		{"4", &cap4, "1", "4"},      // raw equal to capacity
		{"1n", &cap1n, "1.5", "1n"}, // capacity finer than the unit: raw = capacity kept
		{"1n", nil, "1.5", "1n"},    // rounds to 0m: never below raw
		{"3800m", nil, "1", "3800m"},
	} {
		var ratio Ratio
		if c.ratio != "" {
			ratio = mustRatio(c.ratio)
		}
		got := Amplify(CPU, resource.MustParse(c.raw), c.cap, ratio)
		if got.String() != c.want {
			t.Errorf("Amplify(%s, ×%s) = %s, want %s", c.raw, c.ratio, got.String(), c.want)
		}
	}
}
