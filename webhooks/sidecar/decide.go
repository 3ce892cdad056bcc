package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Code is the deciding rule of a Decision: low-cardinality, used as the
// reason label of the injector's metrics and printed by check-inject.
type Code string

// Decision codes, in the order Decide checks them.
const (
	// CodeAlreadyInjected: this injector's status annotation is on the pod.
	CodeAlreadyInjected Code = "AlreadyInjected"
	// CodeInjectedByOther: another SidecarInjector's status annotation is on
	// the pod. There is one status annotation per pod, so only the first
	// injector to see a pod injects it; this one says so in a warning.
	CodeInjectedByOther Code = "InjectedByOther"
	// CodeSystemNamespace: kube-system, kube-public or kube-node-lease.
	CodeSystemNamespace Code = "SystemNamespace"
	// CodeOperatorNamespace: the operator's namespace, the CR's server
	// namespace or one of Params.ExcludedNamespaces.
	CodeOperatorNamespace Code = "OperatorNamespace"
	// CodeSpared: the pod is in the spared set (v1alpha1.Spared): a
	// critical priority class or a mirror pod, which the webhook's
	// matchConditions keep from the injector, or a namespace of
	// Params.SparedNamespaces. The API server never calls the webhook
	// for it, so it is not counted as missing its sidecars.
	CodeSpared Code = "Spared"
	// CodeNamespaceSelector: the namespace's labels do not match
	// spec.namespaceSelector (only when they are known).
	CodeNamespaceSelector Code = "NamespaceSelector"
	// CodeObjectSelector: the pod's labels do not match spec.objectSelector.
	CodeObjectSelector Code = "ObjectSelector"
	// CodeHostNetwork: a hostNetwork pod and spec.injectHostNetwork false.
	CodeHostNetwork Code = "HostNetwork"
	// CodeLabel and CodeAnnotation: the pod's inject label (which wins) or
	// annotation said yes or no.
	CodeLabel      Code = "Label"
	CodeAnnotation Code = "Annotation"
	// CodeNeverInjectSelector and CodeAlwaysInjectSelector: one of the
	// selectors matched the pod's labels (never wins).
	CodeNeverInjectSelector  Code = "NeverInjectSelector"
	CodeAlwaysInjectSelector Code = "AlwaysInjectSelector"
	// CodePolicy: the pod says nothing; spec.policy decided.
	CodePolicy Code = "Policy"
)

// Decision is whether a pod should carry this injector's sidecars, and why.
type Decision struct {
	// Inject is true when the pod should be injected. A pod already
	// carrying this injector's sidecars (CodeAlreadyInjected) is false: it
	// gets nothing more.
	Inject bool
	// Code is the deciding rule.
	Code Code
	// Reason is a human-readable sentence naming the deciding rule.
	Reason string
	// Warnings are ignored inputs (e.g. an inject label with value "maybe").
	Warnings []string
}

// systemNamespaces are never injected: their pods run the control plane, and
// injecting a webhook-dependent sidecar there can deadlock cluster bootstrap.
var systemNamespaces = map[string]bool{
	"kube-system":     true,
	"kube-public":     true,
	"kube-node-lease": true,
}

// ParseBool parses an inject label/annotation value: true, y, yes, on and
// false, n, no, off, case-insensitively. ok is false for any other value.
func ParseBool(s string) (value, ok bool) {
	switch strings.ToLower(s) {
	case "true", "y", "yes", "on":
		return true, true
	case "false", "n", "no", "off":
		return false, true
	}
	return false, false
}

// DecideInput is what Decide reads about a pod.
type DecideInput struct {
	// Pod is read for its labels, annotations (inject, status, mirror),
	// spec.hostNetwork and spec.priorityClassName, and for its container names when Containers is
	// nil: a pod from a metadata-and-names trimmed informer is enough.
	Pod *corev1.Pod
	// Namespace of the pod (from the admission request; pod.Namespace may be empty).
	Namespace string
	// NamespaceLabels are checked against spec.namespaceSelector when non-nil.
	// The webhook passes nil: the API server already applied the selector.
	// A caller outside admission passes the namespace's labels (an empty
	// map for none) to check it.
	NamespaceLabels map[string]string
	// Containers are the names of the pod's initContainers and containers.
	// When nil they are read from Pod.Spec.
	Containers []string
}

// Decide tells whether the pod should carry the sidecars of cfg (a
// SidecarInjector compiled by Compile) and by which rule. It is the
// injector's own decision: Inject calls it for every admission, kube-inject
// and check-inject, and the operator may call it for pods that already
// exist; it reads nothing but its arguments. p gives the operator's
// namespace and, outside admission, Params.ExcludedNamespaces (the
// namespaces the webhook configuration keeps from the injector).
//
// The order follows Istio's
// injectRequired (pkg/kube/inject/inject.go): already injected (by this
// injector, or by another one, which is reported as such; a status
// annotation naming a container the pod lacks is stale and ignored with a
// warning, so a copied or edited pod spec is injected again), excluded
// namespaces, the spared set (v1alpha1.Spared: critical priority classes,
// mirror pods, Params.SparedNamespaces; what the webhook's matchConditions
// and namespaceSelector keep from it), namespace and object selectors,
// hostNetwork (unless
// spec.injectHostNetwork), the inject label (wins over the annotation), the
// inject annotation, neverInjectSelector (wins), alwaysInjectSelector, policy.
// An inject value outside ParseBool's set is ignored with a warning.
func Decide(cfg *Config, p Params, in DecideInput) Decision {
	pod := in.Pod
	d := Decision{}
	s, ok := pod.Annotations[v1alpha1.SidecarStatusKey]
	// Parsed once: the fleet decides every pod for every injector.
	var st Status
	stErr := errNoStatus
	if ok {
		st, stErr = parseStatus(s)
		if missing := staleStatus(st, stErr, in); len(missing) > 0 {
			// A copied pod spec or an edited manifest: the annotation is
			// ours but what it records is gone, so the pod is not injected.
			d.Warnings = append(d.Warnings, fmt.Sprintf("annotation %s names containers the pod lacks (%s): injecting again",
				v1alpha1.SidecarStatusKey, short(strings.Join(missing, ","), 120)))
			ok = false
		}
	}
	if ok {
		if injector, ok := statusInjector(s, st, stErr); ok && injector != "" && injector != cfg.Name {
			return decided(d, false, CodeInjectedByOther, fmt.Sprintf("pod already injected by SidecarInjector %q (annotation %s): a pod is injected by one SidecarInjector only", short(injector, 253), v1alpha1.SidecarStatusKey))
		}
		return decided(d, false, CodeAlreadyInjected, fmt.Sprintf("pod already carries annotation %s (%s)", v1alpha1.SidecarStatusKey, short(s, 120)))
	}
	if systemNamespaces[in.Namespace] {
		return decided(d, false, CodeSystemNamespace, fmt.Sprintf("namespace %q is a system namespace and is never injected", in.Namespace))
	}
	if in.Namespace != "" && (in.Namespace == p.OperatorNamespace || in.Namespace == cfg.ServerNamespace ||
		(slices.Contains(p.ExcludedNamespaces, in.Namespace) && !slices.Contains(p.SparedNamespaces, in.Namespace))) {
		return decided(d, false, CodeOperatorNamespace, fmt.Sprintf("namespace %q runs the operator or webhook servers and is never injected", in.Namespace))
	}
	if why := v1alpha1.Spared(pod, in.Namespace, p.SparedNamespaces); why != "" {
		return decided(d, false, CodeSpared, "spared: "+short(why, 300))
	}
	if in.NamespaceLabels != nil && cfg.namespaceSelector != nil && !cfg.namespaceSelector.Matches(labels.Set(in.NamespaceLabels)) {
		return decided(d, false, CodeNamespaceSelector, fmt.Sprintf("namespace %q labels do not match namespaceSelector %s", in.Namespace, cfg.namespaceSelector))
	}
	if cfg.objectSelector != nil && !cfg.objectSelector.Matches(labels.Set(pod.Labels)) {
		return decided(d, false, CodeObjectSelector, fmt.Sprintf("pod labels do not match objectSelector %s", cfg.objectSelector))
	}
	if pod.Spec.HostNetwork && !cfg.InjectHostNetwork {
		return decided(d, false, CodeHostNetwork, "pod uses hostNetwork and spec.injectHostNetwork is false")
	}
	if v, ok := pod.Labels[v1alpha1.SidecarInjectKey]; ok {
		if b, valid := ParseBool(v); valid {
			return decided(d, b, CodeLabel, fmt.Sprintf("label %s=%q", v1alpha1.SidecarInjectKey, v))
		}
		d.Warnings = append(d.Warnings, fmt.Sprintf("ignored label %s=%q: want true/false, y/n, yes/no or on/off", v1alpha1.SidecarInjectKey, short(v, 63)))
	}
	if v, ok := pod.Annotations[v1alpha1.SidecarInjectKey]; ok {
		if b, valid := ParseBool(v); valid {
			return decided(d, b, CodeAnnotation, fmt.Sprintf("annotation %s=%q", v1alpha1.SidecarInjectKey, v))
		}
		d.Warnings = append(d.Warnings, fmt.Sprintf("ignored annotation %s=%q: want true/false, y/n, yes/no or on/off", v1alpha1.SidecarInjectKey, short(v, 63)))
	}
	set := labels.Set(pod.Labels)
	for i, s := range cfg.neverInject {
		if s.Matches(set) {
			return decided(d, false, CodeNeverInjectSelector, fmt.Sprintf("pod labels match neverInjectSelector[%d] %s", cfg.neverIdx[i], s))
		}
	}
	for i, s := range cfg.alwaysInject {
		if s.Matches(set) {
			return decided(d, true, CodeAlwaysInjectSelector, fmt.Sprintf("pod labels match alwaysInjectSelector[%d] %s", cfg.alwaysIdx[i], s))
		}
	}
	if cfg.Policy == v1alpha1.PolicyDisabled {
		return decided(d, false, CodePolicy, "pod says nothing and policy is Disabled")
	}
	return decided(d, true, CodePolicy, "pod says nothing and policy is Enabled")
}

// NamespaceKey is all Decide reads of a namespace for one config and its
// Params: the same pod in two namespaces with equal keys gets the same
// Inject and Code (only the reason names the namespace). Build it with
// KeyOfNamespace.
type NamespaceKey struct {
	// Name is set for a namespace Decide treats by its name: a system,
	// operator, server, excluded or spared one.
	Name string
	// Fails tells that the namespace's labels do not match
	// spec.namespaceSelector (unknown labels, or no selector, pass).
	Fails bool
}

// KeyOfNamespace is ns's NamespaceKey for cfg and p, with the namespace's
// labels as DecideInput.NamespaceLabels takes them (nil: unknown). The
// fleet keys its memo of decisions on it, so that a SidecarInjector change
// decides each pod template once per kind of namespace, not once per
// namespace (every namespace has labels of its own:
// kubernetes.io/metadata.name).
func KeyOfNamespace(cfg *Config, p Params, ns string, nsLabels map[string]string) NamespaceKey {
	if ns != "" && (systemNamespaces[ns] || ns == p.OperatorNamespace || ns == cfg.ServerNamespace ||
		slices.Contains(p.ExcludedNamespaces, ns) || slices.Contains(p.SparedNamespaces, ns)) {
		return NamespaceKey{Name: ns}
	}
	return NamespaceKey{Fails: nsLabels != nil && cfg.namespaceSelector != nil && !cfg.namespaceSelector.Matches(labels.Set(nsLabels))}
}

// parseStatus parses a status annotation. A function of its own so that
// only a pod that has the annotation pays for the parse's allocation.
func parseStatus(annotation string) (Status, error) {
	var st Status
	err := json.Unmarshal([]byte(annotation), &st)
	return st, err
}

// errNoStatus stands for a pod without the status annotation.
var errNoStatus = errors.New("no status annotation")

// statusInjector is the injector a status annotation names. st and err
// are the annotation parsed as a Status; where that failed on another
// field's type, the injector alone is read as before (ok false: the
// annotation is not JSON).
func statusInjector(annotation string, st Status, err error) (string, bool) {
	if err == nil {
		return st.Injector, true
	}
	var only struct {
		Injector string `json:"injector"`
	}
	if json.Unmarshal([]byte(annotation), &only) != nil {
		return "", false
	}
	return only.Injector, true
}

// staleStatus returns the containers a status annotation (st, parsed with
// err) lists that the pod does not have (in either list), nil when it has
// them all or the annotation lists none or does not parse (then the pod
// counts as injected, as before).
func staleStatus(st Status, err error, in DecideInput) []string {
	if err != nil || len(st.InitContainers)+len(st.Containers) == 0 {
		return nil
	}
	have := in.Containers
	if have == nil {
		for _, c := range in.Pod.Spec.InitContainers {
			have = append(have, c.Name)
		}
		for _, c := range in.Pod.Spec.Containers {
			have = append(have, c.Name)
		}
	}
	var missing []string
	for _, n := range append(slices.Clone(st.InitContainers), st.Containers...) {
		if !slices.Contains(have, n) && !slices.Contains(missing, n) {
			missing = append(missing, n)
		}
	}
	return missing
}

func decided(d Decision, inject bool, c Code, reason string) Decision {
	d.Inject, d.Code, d.Reason = inject, c, reason
	return d
}

// short truncates pod-controlled text quoted into messages and logs.
func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
