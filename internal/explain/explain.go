// Package explain answers `hookwright explain-node NODE`: why a node
// publishes the allocatable it does. Node is a pure function of what the
// command reads (the node, every NodeOversell, the node's pods and, when
// served, its metrics); it decides the winner with the oversell servers'
// own routing (webhooks/oversell Snapshot.RouteNode) and recomputes the
// published value with their arithmetic, so it cannot disagree with them.
//
// It must not import a client: cmd/explainnode.go reads, this explains.
package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/usageratio"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// Input is what the command read.
type Input struct {
	Node          *corev1.Node
	NodeOversells []v1alpha1.NodeOversell
	// Pods are the pods bound to the node.
	Pods []corev1.Pod
	// Usage is the node's pods' usage from metrics.k8s.io (nil when not
	// served), and when it was measured.
	Usage     corev1.ResourceList
	UsageTime time.Time
	// UsageProblem says why there is no usage.
	UsageProblem string
	Now          time.Time
}

// Report is the explanation, one field per line of output.
type Report struct {
	Node string
	// Lines are "name: value" pairs in output order.
	Lines [][2]string
}

func (r *Report) add(k, format string, args ...any) {
	r.Lines = append(r.Lines, [2]string{k, fmt.Sprintf(format, args...)})
}

// Write prints the report as aligned "name: value" lines.
func (r *Report) Write(w io.Writer) error {
	width := 0
	for _, l := range r.Lines {
		width = max(width, len(l[0]))
	}
	for _, l := range r.Lines {
		if _, err := fmt.Fprintf(w, "%-*s  %s\n", width+1, l[0]+":", l[1]); err != nil {
			return err
		}
	}
	return nil
}

// Node explains in.Node.
func Node(in Input) Report {
	n := in.Node
	r := Report{Node: n.Name}
	ann := n.Annotations
	r.add("node", "%s", n.Name)
	r.add("capacity", "%s", cpuMem(n.Status.Capacity))

	raw, rawErr := readQuantities(ann[v1alpha1.OversellRawAllocatableKey])
	switch {
	case ann[v1alpha1.OversellRawAllocatableKey] == "":
		r.add("raw allocatable", "%s (no NodeOversell amplified this node: the published value is the kubelet's)", cpuMem(n.Status.Allocatable))
	case rawErr != nil:
		r.add("raw allocatable", "unreadable %s: %v", v1alpha1.OversellRawAllocatableKey, rawErr)
	default:
		r.add("raw allocatable", "%s (the kubelet's last report, %s)", cpuMem(raw), v1alpha1.OversellRawAllocatableKey)
	}
	r.add("effective allocatable", "%s (published in status.allocatable)", cpuMem(n.Status.Allocatable))

	// The ratios the engine applied, and why.
	var ratios map[string]string
	_ = json.Unmarshal([]byte(ann[v1alpha1.OversellRatiosKey]), &ratios)
	by := ann[v1alpha1.OversellAppliedByKey]
	var tgt *v1alpha1.OversellTarget
	if s := ann[v1alpha1.OversellTargetKey]; s != "" {
		t := v1alpha1.OversellTarget{}
		if json.Unmarshal([]byte(s), &t) == nil {
			tgt = &t
		}
	}
	if by == "" {
		r.add("ratio", "none applied")
	} else {
		r.add("ratio", "%s", ratioLine(ratios, tgt, by))
	}

	winner, why := decide(in)
	r.add("deciding NodeOversell", "%s", why)
	if winner != "" && by != "" && winner != by {
		r.add("note", "the node was last amplified by %s; %s's server applies at the node's next status write", by, winner)
	}

	excl := ratios["exclusiveCPU"]
	switch {
	case excl != "":
		r.add("exclusive CPUs subtracted", "%s (Guaranteed pods with integer cpu on a static CPU manager node: cpu = (raw - %s) x ratio + %s)", excl, excl, excl)
	case tgt != nil && tgt.ExclusiveCPU != "":
		r.add("exclusive CPUs subtracted", "%s (in the target; applied at the next status write)", tgt.ExclusiveCPU)
	default:
		r.add("exclusive CPUs subtracted", "none%s", staticNote(n, in.NodeOversells))
	}

	r.add("last kubelet report", "%s", lastReport(n, raw, rawErr == nil && len(raw) > 0, in.Now))

	req, count := podRequests(in.Pods)
	r.add("running pods", "%d, requesting %s", count, cpuMem(req))
	r.add("headroom", "%s", headroom(n.Status.Allocatable, raw, req))
	switch {
	case in.Usage != nil:
		r.add("usage (metrics.k8s.io)", "%s at %s", cpuMem(in.Usage), in.UsageTime.UTC().Format(time.RFC3339))
	case in.UsageProblem != "":
		r.add("usage (metrics.k8s.io)", "%s", in.UsageProblem)
	}
	r.add("taint", "%s", taintLine(n, tgt))
	return r
}

// ratioLine is the ratios in use with each one's source and hold.
func ratioLine(ratios map[string]string, t *v1alpha1.OversellTarget, by string) string {
	var parts []string
	for _, res := range []string{"cpu", "memory"} {
		v := ratios[res]
		if v == "" {
			continue
		}
		src := v1alpha1.RatioSourceStatic + " (spec.ratios)"
		var rt *v1alpha1.OversellResourceTarget
		if t != nil && t.By == by {
			rt = t.CPU
			if res == "memory" {
				rt = t.Memory
			}
		}
		if rt != nil {
			src = rt.Source
			if rt.Changed != "" {
				src += ", since " + rt.Changed
			}
		}
		parts = append(parts, fmt.Sprintf("%s %s (%s)", res, v, src))
	}
	if t != nil && t.By == by && t.Held != "" {
		parts = append(parts, "held for running pods: "+t.Held)
	}
	if t != nil && t.By == by && t.PressureSince != "" {
		p := "pressure back-off since " + t.PressureSince
		if t.BelowSince != "" {
			p += ", below the threshold since " + t.BelowSince
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return "none recorded in " + v1alpha1.OversellRatiosKey
	}
	return strings.Join(parts, "; ") + " by " + by
}

// decide names the NodeOversell whose server changes the node, and why it
// wins: the servers' routing (priority, then age, then name; a node held
// through the node label).
func decide(in Input) (string, string) {
	n := in.Node
	objs := make([]*v1alpha1.NodeOversell, 0, len(in.NodeOversells))
	for i := range in.NodeOversells {
		objs = append(objs, &in.NodeOversells[i])
	}
	snap := oversell.BuildSnapshot(objs, nil, true)
	var selecting []*oversell.Policy
	for _, p := range snap.Policies {
		if p.Selector.Matches(labels.Set(n.Labels)) {
			selecting = append(selecting, p)
		}
	}
	p, _ := snap.RouteNode(oversell.NodeState{Labels: n.Labels, Annotations: n.Annotations}, "")
	switch {
	case p == nil && len(snap.Ignored) > 0:
		return "", fmt.Sprintf("none selects the node (ignored as invalid: %s)", ignoredNames(snap.Ignored))
	case p == nil:
		return "", "none selects the node"
	case len(selecting) == 0:
		state := ""
		if slicesContains(snap.Deleting, p.Name) {
			state = ", being deleted"
		}
		return p.Name, fmt.Sprintf("%s (it no longer selects the node%s, but holds it: label %s=%s and a target for it; released once the pods fit the raw allocatable)",
			p.Name, state, v1alpha1.OversellNodeLabel, p.Name)
	case len(selecting) == 1:
		return p.Name, fmt.Sprintf("%s (the only NodeOversell selecting the node; priority %d)", p.Name, p.Priority)
	}
	second := selecting[1]
	var why string
	switch {
	case p.Priority != second.Priority:
		why = fmt.Sprintf("highest priority %d (next: %s with %d)", p.Priority, second.Name, second.Priority)
	case !p.Created.Equal(second.Created):
		why = fmt.Sprintf("same priority %d as %s, created first (%s)", p.Priority, second.Name, p.Created.UTC().Format(time.RFC3339))
	default:
		why = fmt.Sprintf("same priority and age as %s, first by name", second.Name)
	}
	names := make([]string, 0, len(selecting))
	for _, s := range selecting {
		names = append(names, s.Name)
	}
	return p.Name, fmt.Sprintf("%s (%s; %d select the node: %s)", p.Name, why, len(selecting), strings.Join(names, ", "))
}

func ignoredNames(ig []oversell.Ignored) string {
	var out []string
	for _, i := range ig {
		out = append(out, i.Name+": "+i.Reason)
	}
	return strings.Join(out, "; ")
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// staticNote says why nothing is subtracted.
func staticNote(n *corev1.Node, nos []v1alpha1.NodeOversell) string {
	if n.Labels[v1alpha1.CPUManagerPolicyLabel] == "static" {
		return " (static CPU manager node, no Guaranteed integer-cpu pod)"
	}
	for _, no := range nos {
		if no.Spec.StaticCPUManagerNodes != nil {
			return " (not a static CPU manager node as labelled or selected by spec.staticCPUManagerNodes)"
		}
	}
	return " (not labelled " + v1alpha1.CPUManagerPolicyLabel + "=static)"
}

// lastReport is the kubelet's last recorded report and its last status
// write (the Ready condition's heartbeat).
func lastReport(n *corev1.Node, raw corev1.ResourceList, rawOK bool, now time.Time) string {
	var hb time.Time
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			hb = c.LastHeartbeatTime.Time
		}
	}
	what := "allocatable " + cpuMem(n.Status.Allocatable) + " (no raw recorded)"
	if rawOK {
		what = "allocatable " + cpuMem(raw)
	}
	if hb.IsZero() {
		return what + "; no Ready heartbeat recorded"
	}
	return fmt.Sprintf("%s; last status heartbeat %s (%s ago)", what, hb.UTC().Format(time.RFC3339), now.Sub(hb).Round(time.Second))
}

// podRequests sums the cpu and memory requests of the running pods, as
// the scheduler counts them (usageratio.PodRequests).
func podRequests(pods []corev1.Pod) (corev1.ResourceList, int) {
	sum := corev1.ResourceList{}
	count := 0
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		count++
		for k, q := range usageratio.PodRequests(p) {
			v := sum[k]
			v.Add(q)
			sum[k] = v
		}
	}
	return sum, count
}

// headroom is allocatable minus requests, published and raw.
func headroom(alloc, raw, req corev1.ResourceList) string {
	var parts []string
	for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		a, ok := alloc[k]
		if !ok {
			continue
		}
		h := a.DeepCopy()
		h.Sub(req[k])
		s := fmt.Sprintf("%s %s of the published", k, h.String())
		if rq, ok := raw[k]; ok {
			hr := rq.DeepCopy()
			hr.Sub(req[k])
			s += fmt.Sprintf(", %s of the raw", hr.String())
			if hr.Sign() < 0 {
				s += " (the pods rely on the amplification: held for them if the ratio is cut)"
			}
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// taintLine is our taint and why.
func taintLine(n *corev1.Node, t *v1alpha1.OversellTarget) string {
	for _, tt := range n.Spec.Taints {
		if tt.Key != v1alpha1.OversellTaintKey {
			continue
		}
		why := ""
		switch {
		case tt.Value == v1alpha1.OversellTaintPressure && t != nil && t.PressureSince != "":
			why = ": usage crossed spec.usage.pressureThreshold at " + t.PressureSince
		case tt.Value == v1alpha1.OversellTaintRatioCut && t != nil && t.Held != "":
			why = ": " + t.Held
		}
		return fmt.Sprintf("%s=%s:%s%s", tt.Key, tt.Value, tt.Effect, why)
	}
	return "none of ours (" + v1alpha1.OversellTaintKey + ")"
}

func readQuantities(s string) (corev1.ResourceList, error) {
	if s == "" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	out := corev1.ResourceList{}
	for _, k := range []string{"cpu", "memory"} {
		if v, ok := m[k]; ok {
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return nil, fmt.Errorf("%s %q: %w", k, v, err)
			}
			out[corev1.ResourceName(k)] = q
		}
	}
	return out, nil
}

func cpuMem(l corev1.ResourceList) string {
	var parts []string
	keys := []string{}
	for k := range l {
		if k == corev1.ResourceCPU || k == corev1.ResourceMemory {
			keys = append(keys, string(k))
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		q := l[corev1.ResourceName(k)]
		parts = append(parts, k+" "+q.String())
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
