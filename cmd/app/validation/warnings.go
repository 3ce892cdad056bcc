package validation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/template"
	"text/template/parse"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// maxWarningRunes keeps each warning within the 256 characters the API
// server passes on untruncated (AdmissionResponse.warnings, k8s.io/api
// admission/v1).
const maxWarningRunes = 256

// nodeOversellWarnings returns the admission warnings for a NodeOversell
// that compiles: a memory ratio above 1 (memory is not compressible: pods
// scheduled onto inflated memory are OOM-killed or evicted, see
// kubernetes/kubernetes#78580), failurePolicy Fail (kept by an object
// stored before the CRD forbade it) and a selector that matches every node,
// control-plane nodes included. p is no's compiled policy.
func nodeOversellWarnings(no *v1alpha1.NodeOversell, p *oversell.Policy) []string {
	var w []string
	if r := p.Ratios[oversell.Memory]; r.IsSet() && !r.IsOne() {
		w = append(w, fmt.Sprintf("spec.ratios.memory %s is above 1: memory is not compressible, so nodes can run out of it "+
			"and the kernel OOM-kills pods (kubernetes/kubernetes#78580)", r))
	}
	if no.Spec.FailurePolicy == v1alpha1.FailurePolicyFail {
		// New objects cannot say Fail (a CRD rule); one stored before the
		// rule keeps it through updates (validation ratcheting), and the
		// operator configures its webhook with Ignore regardless.
		w = append(w, "failurePolicy Fail is not honoured: the operator configures Ignore, since with Fail a webhook server outage would block every node's status writes; set Ignore")
	}
	if sel := no.Spec.NodeSelector; sel == nil || len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		w = append(w, "spec.nodeSelector is empty: every node is oversold, control-plane nodes included")
	}
	return w
}

// sidecarInjectorWarnings returns the admission warnings for a
// SidecarInjector that compiles: failurePolicy Fail (the default) without a
// namespaceSelector, where an injector outage blocks pod creation in every
// namespace not excluded by the operator, and every template action that
// emits a pod-controlled value (reached from .ObjectMeta or .Spec, or
// through the annotation, label and podName helpers) without quote,
// toJSON or toYAML, where a pod author can write YAML structure into the
// injected spec.
func sidecarInjectorWarnings(si *v1alpha1.SidecarInjector) []string {
	var w []string
	if si.WithDefaults().Spec.FailurePolicy == v1alpha1.FailurePolicyFail && si.Spec.NamespaceSelector == nil {
		w = append(w, "failurePolicy Fail with no spec.namespaceSelector: while the injector is unavailable, "+
			"no pod can be created in any namespace it serves; select namespaces or use Ignore")
	}
	w = append(w, rolloutWarnings(&si.Spec.Rollout)...)
	funcs := sidecar.FuncMap()
	for _, t := range si.Spec.Templates {
		tm, err := template.New(t.Name).Funcs(funcs).Parse(t.Template)
		if err != nil {
			continue // reported by Compile
		}
		w = append(w, unquotedPodValues(tm)...)
	}
	return w
}

// unquotedPodValues returns one warning per action of tm (and of the
// templates it defines) that prints a pod-controlled value unescaped, as
// "template NAME:LINE:COL: ...". A value is pod-controlled when it is read
// from .ObjectMeta or .Spec of the root (or of $), from a variable or dot
// bound to such a value by with, range or :=, or returned by a function
// given one. quote, squote, toJSON/toJson and toYAML/toYaml clean a value;
// functions that return a number, a boolean or an encoding (len, eq, b64enc,
// sha256sum...) do too. {{template}} calls are checked where the named
// template is defined, with its dot taken as the root.
func unquotedPodValues(tm *template.Template) []string {
	var out []string
	ts := tm.Templates()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name() < ts[j].Name() })
	for _, t := range ts {
		if t.Tree == nil || t.Tree.Root == nil {
			continue
		}
		a := &taintWalk{tree: t.Tree}
		a.list(t.Tree.Root, scope{dot: dotRoot, vars: map[string]bool{"$": false}})
		out = append(out, a.warnings...)
	}
	return out
}

type dotKind int

const (
	dotRoot    dotKind = iota // the TemplateData
	dotTainted                // a pod-controlled value
	dotClean                  // anything else
)

// scope is what the walk knows at a point: what dot is and which variables
// hold pod-controlled values ($ is the root, tracked through its fields).
type scope struct {
	dot  dotKind
	vars map[string]bool
}

func (s scope) with(dot dotKind) scope {
	vars := make(map[string]bool, len(s.vars))
	for k, v := range s.vars {
		vars[k] = v
	}
	return scope{dot: dot, vars: vars}
}

type taintWalk struct {
	tree     *parse.Tree
	warnings []string
}

// podFields are the TemplateData fields a pod author controls.
var podFields = map[string]bool{"ObjectMeta": true, "Spec": true}

// podFuncs return a value taken from their pod metadata argument.
var podFuncs = map[string]bool{"annotation": true, "label": true, "podName": true}

// escapers make any value a YAML-safe scalar or flow/block document.
var escapers = map[string]bool{"quote": true, "squote": true, "toJSON": true, "toJson": true, "toYAML": true, "toYaml": true}

// safeFuncs return numbers, booleans or encodings that cannot carry YAML
// structure whatever their input.
var safeFuncs = map[string]bool{
	"len": true, "eq": true, "ne": true, "lt": true, "le": true, "gt": true, "ge": true, "not": true,
	"empty": true, "isset": true, "hasKey": true, "has": true, "contains": true, "hasPrefix": true, "hasSuffix": true,
	"int": true, "int64": true, "float64": true, "atoi": true, "kindIs": true, "typeIs": true,
	"b64enc": true, "b32enc": true, "sha1sum": true, "sha256sum": true, "adler32sum": true,
}

func (a *taintWalk) list(l *parse.ListNode, s scope) {
	if l == nil {
		return
	}
	for _, n := range l.Nodes {
		a.node(n, s)
	}
}

func (a *taintWalk) node(n parse.Node, s scope) {
	switch n := n.(type) {
	case *parse.ActionNode:
		t := a.pipe(n.Pipe, s)
		if len(n.Pipe.Decl) > 0 {
			return // an assignment prints nothing
		}
		if t {
			a.warn(n, "prints")
		}
	case *parse.IfNode:
		a.pipe(n.Pipe, s)
		a.list(n.List, s)
		a.list(n.ElseList, s)
	case *parse.WithNode:
		a.list(n.List, s.with(a.dotOf(n.Pipe, s)))
		a.list(n.ElseList, s)
	case *parse.RangeNode:
		inner := s.with(dotClean)
		if a.pipeTainted(n.Pipe, s) {
			inner = s.with(dotTainted)
			for _, v := range n.Pipe.Decl {
				inner.vars[v.Ident[0]] = true
			}
		}
		a.list(n.List, inner)
		a.list(n.ElseList, s)
	case *parse.TemplateNode:
		// The definition is checked with a root dot; any other
		// pod-controlled dot would be missed there, so it is reported here.
		if n.Pipe != nil && !isBareDot(n.Pipe) && !isRootVar(n.Pipe) && a.pipeTainted(n.Pipe, s) {
			a.warn(n, "passes")
		}
	case *parse.ListNode:
		a.list(n, s)
	}
}

// pipe records the pipeline's declarations in s and reports whether its
// value is pod-controlled.
func (a *taintWalk) pipe(p *parse.PipeNode, s scope) bool {
	t := a.pipeTainted(p, s)
	for _, v := range p.Decl {
		s.vars[v.Ident[0]] = t
	}
	return t
}

// dotOf is what dot becomes inside {{with PIPE}}.
func (a *taintWalk) dotOf(p *parse.PipeNode, s scope) dotKind {
	t := a.pipe(p, s)
	if isBareDot(p) {
		return s.dot
	}
	if isRootVar(p) {
		return dotRoot
	}
	if t {
		return dotTainted
	}
	return dotClean
}

func isBareDot(p *parse.PipeNode) bool {
	if p == nil || len(p.Decl) > 0 || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return false
	}
	_, ok := p.Cmds[0].Args[0].(*parse.DotNode)
	return ok
}

func isRootVar(p *parse.PipeNode) bool {
	if p == nil || len(p.Decl) > 0 || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return false
	}
	v, ok := p.Cmds[0].Args[0].(*parse.VariableNode)
	return ok && len(v.Ident) == 1 && v.Ident[0] == "$"
}

// pipeTainted folds the pipeline: each command receives the previous
// command's value as its last argument.
func (a *taintWalk) pipeTainted(p *parse.PipeNode, s scope) bool {
	if p == nil {
		return false
	}
	t := false
	for _, c := range p.Cmds {
		t = a.cmdTainted(c, s, t)
	}
	return t
}

func (a *taintWalk) cmdTainted(c *parse.CommandNode, s scope, in bool) bool {
	if len(c.Args) == 0 {
		return in
	}
	if id, ok := c.Args[0].(*parse.IdentifierNode); ok {
		switch {
		case escapers[id.Ident], safeFuncs[id.Ident]:
			return false
		case podFuncs[id.Ident]:
			return true
		}
		t := in
		for _, arg := range c.Args[1:] {
			t = a.argTainted(arg, s) || t
		}
		return t
	}
	// A value (field, variable, parenthesized pipeline), possibly a method
	// call with arguments.
	t := in
	for _, arg := range c.Args {
		t = a.argTainted(arg, s) || t
	}
	return t
}

func (a *taintWalk) argTainted(n parse.Node, s scope) bool {
	switch n := n.(type) {
	case *parse.DotNode:
		// The root passed whole, as in {{ printf "%v" . }}, prints the pod.
		return s.dot != dotClean
	case *parse.FieldNode:
		return s.dot == dotTainted || s.dot == dotRoot && podFields[n.Ident[0]]
	case *parse.VariableNode:
		if n.Ident[0] == "$" {
			return len(n.Ident) == 1 || podFields[n.Ident[1]]
		}
		return s.vars[n.Ident[0]]
	case *parse.ChainNode:
		if p, ok := n.Node.(*parse.PipeNode); ok {
			return a.pipeTainted(p, s)
		}
		return a.argTainted(n.Node, s)
	case *parse.PipeNode:
		return a.pipeTainted(n, s)
	}
	return false
}

func (a *taintWalk) warn(n parse.Node, verb string) {
	loc, text := a.tree.ErrorContext(n)
	text = strings.Join(strings.Fields(text), " ")
	if r := []rune(text); len(r) > 60 {
		text = string(r[:57]) + "..."
	}
	msg := fmt.Sprintf("template %s: %s %s a pod-controlled value without quote or toJSON: "+
		"a pod author can write YAML structure into the injected spec", loc, text, verb)
	if r := []rune(msg); len(r) > maxWarningRunes {
		msg = string(r[:maxWarningRunes-3]) + "..."
	}
	a.warnings = append(a.warnings, msg)
}

// maxHoldWarnings bounds the per-node warnings of one update.
const maxHoldWarnings = 5

// holdWarnings are the warnings of a NodeOversell update that lowers
// allocatable below what running pods request: a summary, then one line
// per node (at most maxHoldWarnings, then a count), each within
// maxWarningRunes. A preview that fails is a warning too: the update is
// never refused for it.
func (h Handler) holdWarnings(ctx context.Context, oldRaw []byte, cur *v1alpha1.NodeOversell) []string {
	old := &v1alpha1.NodeOversell{}
	if err := json.Unmarshal(oldRaw, old); err != nil {
		return nil
	}
	lines, err := h.Holds(ctx, old, cur)
	if err != nil {
		return []string{clip(fmt.Sprintf("could not check the nodes' running pods against the new allocatable: %v", err))}
	}
	if len(lines) == 0 {
		return nil
	}
	w := []string{clip(fmt.Sprintf("%d nodes run pods that request more than this change leaves them; the cut is held there "+
		"(ratio above the new target, taint %s=%s:NoSchedule) until their pods fit, and the condition RatioHeld names them:",
		len(lines), v1alpha1.OversellTaintKey, v1alpha1.OversellTaintRatioCut))}
	for i, l := range lines {
		if i == maxHoldWarnings {
			w = append(w, fmt.Sprintf("and %d more nodes", len(lines)-maxHoldWarnings))
			break
		}
		w = append(w, clip(l))
	}
	return w
}

// clip cuts s to maxWarningRunes runes.
func clip(s string) string {
	r := []rune(s)
	if len(r) <= maxWarningRunes {
		return s
	}
	return string(r[:maxWarningRunes-3]) + "..."
}

// rolloutWarnings warns about a spec.rollout that acts widely at once: a
// Restart (or InPlace with fallbackToRestart) over every matched pod
// without a partition, selector or namespace selector (every template
// change then restarts every matched workload), and a maxUnavailable above
// 25% (the Deployment default), where a bad image takes down that share of
// the fleet before the rollout stops.
func rolloutWarnings(r *v1alpha1.RolloutSpec) []string {
	var w []string
	restarts := r.Strategy == v1alpha1.RolloutRestart || r.Strategy == v1alpha1.RolloutInPlace && r.FallbackToRestart
	scoped := r.Selector != nil || r.NamespaceSelector != nil || r.Partition != nil && r.Partition.String() != "0" && r.Partition.String() != "0%"
	if restarts && !scoped && !r.Paused {
		w = append(w, "spec.rollout restarts the owners of every matched pod on each revision change, "+
			"within maxUnavailable and PodDisruptionBudgets; set a partition, selector or namespaceSelector for a canary")
	}
	if mu := r.MaxUnavailable; mu != nil && r.Strategy != v1alpha1.RolloutNone && r.Strategy != "" {
		if mu.Type == intstr.String {
			if v, err := intstr.GetScaledValueFromIntOrPercent(mu, 100, false); err == nil && v > 25 {
				w = append(w, fmt.Sprintf("spec.rollout.maxUnavailable %s: a bad sidecar image makes that share of the matched pods unavailable before the rollout stops", mu.String()))
			}
		}
	}
	return w
}

// serverWarnings warns about spec.server settings that can keep the server
// pods from being created or scheduled: a critical priority class
// (system-cluster-critical, system-node-critical) outside kube-system,
// which clusters that limit those classes by ResourceQuota admission
// ("Limit Priority Class consumption by default"; kubernetes#76310 lifted
// the hard-coded kube-system rule in 1.17) refuse unless the namespace has
// a ResourceQuota scoped to the class; and a topology spread constraint
// with DoNotSchedule, which leaves replicas Pending where nodes or zones
// are too few. defaultNamespace is the server namespace when
// spec.server.namespace is empty ("" when unknown).
func serverWarnings(server v1alpha1.ServerSpec, defaultNamespace string) []string {
	var w []string
	ns := server.Namespace
	if ns == "" {
		ns = defaultNamespace
	}
	if pc := server.PriorityClassName; slices.Contains(v1alpha1.CriticalPriorityClasses(), pc) && ns != metav1.NamespaceSystem {
		where := "namespace " + ns
		if ns == "" {
			where = "the server namespace"
		}
		w = append(w, clip(fmt.Sprintf("spec.server.priorityClassName %s: where critical classes are limited by quota (GKE), "+
			"%s needs a ResourceQuota with scopeSelector PriorityClass In [%s] or no server pod is created", pc, where, pc)))
	}
	for i, c := range server.TopologySpreadConstraints {
		if c.WhenUnsatisfiable == corev1.DoNotSchedule {
			w = append(w, clip(fmt.Sprintf("spec.server.topologySpreadConstraints[%d] (%s) is DoNotSchedule: replicas beyond what the nodes or zones allow stay Pending, "+
				"and a server rollout (maxUnavailable 0) waits on them; ScheduleAnyway spreads without that risk", i, c.TopologyKey)))
		}
	}
	return w
}
