package fleet

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// State is what a pod carries of an injector's sidecars.
type State string

// Pod states. A pod of none of them (not matched, not injected by this
// injector, finished or being deleted) is not counted.
const (
	// Current: matched and injected at the injector's current revision.
	Current State = "Current"
	// Outdated: matched and injected at another revision.
	Outdated State = "Outdated"
	// Missing: matched and not injected (created while the webhook was
	// unreachable under failurePolicy Ignore, or before the injector).
	Missing State = "Missing"
	// Orphaned: injected and no longer matched (a selector or label changed).
	Orphaned State = "Orphaned"
)

// Injector is what the classification needs of one SidecarInjector.
type Injector struct {
	// Config is the compiled CR (sidecar.Compile).
	Config *sidecar.Config
	// Params as the operator's webhook configuration sets them: the
	// operator's namespace and desired.InjectorExcludedNamespaces.
	Params sidecar.Params
	// Revision is the CR's current revision (sidecar.Revision).
	Revision string
}

// Pod is one classified pod.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	State     State  `json:"state"`
	// Revision the pod was injected with (empty when not injected).
	Revision string `json:"revision,omitempty"`
	// Reason says why: the deciding rule of sidecar.Decide, the revisions
	// and containers of an outdated pod.
	Reason string `json:"reason"`
	// Created is the pod's creationTimestamp.
	Created time.Time `json:"created"`
}

// Classify tells the state of pod for inj. nsLabels are the labels of the
// pod's namespace (nil: unknown, then spec.namespaceSelector is not
// checked). ok is false for a pod that is not counted.
func Classify(inj Injector, pod *corev1.Pod, nsLabels map[string]string) (p Pod, ok bool) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return Pod{}, false
	}
	in := sidecar.DecideInput{Pod: pod, Namespace: pod.Namespace, NamespaceLabels: nsLabels}
	first := sidecar.Decide(inj.Config, inj.Params, in)
	p = Pod{Namespace: pod.Namespace, Name: pod.Name, Created: pod.CreationTimestamp.Time}
	injected := first.Code == sidecar.CodeAlreadyInjected
	if first.Code == sidecar.CodeInjectedByOther {
		return Pod{}, false
	}
	d := first
	if injected {
		// Would the pod be injected today? The same decision on the pod
		// without the record of its injection.
		bare := *pod
		bare.Annotations = maps.Clone(pod.Annotations)
		delete(bare.Annotations, v1alpha1.SidecarStatusKey)
		in.Pod = &bare
		d = sidecar.Decide(inj.Config, inj.Params, in)
	}
	switch {
	case injected && d.Inject:
		p.Revision = podRevision(pod)
		if p.Revision == inj.Revision {
			p.State, p.Reason = Current, fmt.Sprintf("injected at revision %s", inj.Revision)
		} else {
			p.State, p.Reason = Outdated, fmt.Sprintf("injected at revision %s, current revision %s (containers %s)",
				orUnknown(p.Revision), inj.Revision, strings.Join(injectedContainers(pod), ","))
		}
	case injected:
		p.Revision = podRevision(pod)
		p.State, p.Reason = Orphaned, "carries the sidecars but no longer matches: "+d.Reason
	case d.Inject:
		p.State, p.Reason = Missing, "should carry the sidecars ("+d.Reason+") and does not"
	default:
		return Pod{}, false
	}
	return p, true
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// podRevision is the revision a pod was injected with: its revision
// label (the same value, set with the annotation), else for pods injected
// before the label existed its status annotation's configHash.
func podRevision(pod *corev1.Pod) string {
	if r := pod.Labels[v1alpha1.SidecarRevisionKey]; r != "" {
		return r
	}
	var st sidecar.Status
	_ = json.Unmarshal([]byte(pod.Annotations[v1alpha1.SidecarStatusKey]), &st)
	return st.ConfigHash
}

// injectedContainers are the containers the status annotation records.
func injectedContainers(pod *corev1.Pod) []string {
	var st sidecar.Status
	_ = json.Unmarshal([]byte(pod.Annotations[v1alpha1.SidecarStatusKey]), &st)
	return append(slices.Clone(st.InitContainers), st.Containers...)
}

// TopNamespaces is how many namespaces status.fleet lists.
const TopNamespaces = 20

// MaxNamedPods is how many pods a condition names.
const MaxNamedPods = 5

// Summary is the fleet of one injector.
type Summary struct {
	Status v1alpha1.FleetStatus
	// Namespaces are every namespace's counts, by name.
	Namespaces []v1alpha1.NamespaceFleet
	// Outdated and Missing are the first MaxNamedPods pods of each state
	// (by namespace and name).
	Outdated, Missing []Pod
}

func add(c *v1alpha1.FleetCounts, s State) {
	switch s {
	case Current:
		c.CurrentPods++
	case Outdated:
		c.OutdatedPods++
	case Missing:
		c.MissingPods++
	case Orphaned:
		c.OrphanedPods++
	}
	c.MatchedPods = c.CurrentPods + c.OutdatedPods + c.MissingPods
	c.InjectedPods = c.CurrentPods + c.OutdatedPods + c.OrphanedPods
}

// Summarize counts pods (in any order) into a Summary. The result does not
// depend on the order of pods.
func Summarize(pods []Pod) Summary {
	sorted := slices.Clone(pods)
	slices.SortFunc(sorted, func(a, b Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var total v1alpha1.FleetCounts
	var outdated, missing []Pod
	byNS := map[string]*v1alpha1.NamespaceFleet{}
	for _, p := range sorted {
		add(&total, p.State)
		n := byNS[p.Namespace]
		if n == nil {
			n = &v1alpha1.NamespaceFleet{Name: p.Namespace}
			byNS[p.Namespace] = n
		}
		add(&n.FleetCounts, p.State)
		switch {
		case p.State == Outdated && len(outdated) < MaxNamedPods:
			outdated = append(outdated, p)
		case p.State == Missing && len(missing) < MaxNamedPods:
			missing = append(missing, p)
		}
	}
	nss := make([]v1alpha1.NamespaceFleet, 0, len(byNS))
	for _, n := range byNS {
		nss = append(nss, *n)
	}
	return SummarizeCounts(total, nss, outdated, missing)
}

// SummarizeCounts is Summarize from counts kept elsewhere (the operator's
// pod index): total, every namespace's counts (any order; namespaces
// without a counted pod left out) and the first MaxNamedPods outdated and
// missing pods by namespace and name.
func SummarizeCounts(total v1alpha1.FleetCounts, namespaces []v1alpha1.NamespaceFleet, outdated, missing []Pod) Summary {
	s := Summary{Outdated: outdated, Missing: missing}
	s.Status.FleetCounts = total
	s.Namespaces = slices.SortedFunc(slices.Values(namespaces), func(a, b v1alpha1.NamespaceFleet) int { return cmp.Compare(a.Name, b.Name) })
	if len(s.Namespaces) == 0 {
		s.Namespaces = nil
	}
	s.Status.NamespacesTotal = int32(len(s.Namespaces))
	top := slices.Clone(s.Namespaces)
	slices.SortStableFunc(top, func(a, b v1alpha1.NamespaceFleet) int {
		return cmp.Compare(b.OutdatedPods+b.MissingPods, a.OutdatedPods+a.MissingPods)
	})
	if len(top) > TopNamespaces {
		top = top[:TopNamespaces]
	}
	if len(top) > 0 {
		s.Status.Namespaces = top
	}
	return s
}

// SetConditions sets PodsUpToDate and PodsMissingSidecars from s on conds
// (apimeta.SetStatusCondition: the transition time moves only with the
// status). generation is the CR's.
func SetConditions(conds *[]metav1.Condition, s Summary, generation int64) {
	up := metav1.Condition{Type: v1alpha1.ConditionPodsUpToDate, ObservedGeneration: generation,
		Status: metav1.ConditionTrue, Reason: "UpToDate", Message: fmt.Sprintf("%d injected pods at the current revision", s.Status.CurrentPods)}
	if n := s.Status.OutdatedPods; n > 0 {
		up.Status, up.Reason = metav1.ConditionFalse, "Outdated"
		up.Message = fmt.Sprintf("%d pods carry an older revision: %s", n, named(s.Outdated, int(n)))
	}
	miss := metav1.Condition{Type: v1alpha1.ConditionPodsMissingSidecars, ObservedGeneration: generation,
		Status: metav1.ConditionFalse, Reason: "NoneMissing", Message: "every matched pod carries the sidecars"}
	if n := s.Status.MissingPods; n > 0 {
		miss.Status, miss.Reason = metav1.ConditionTrue, "Missing"
		miss.Message = fmt.Sprintf("%d pods should carry the sidecars and do not: %s", n, named(s.Missing, int(n)))
	}
	apimeta.SetStatusCondition(conds, up)
	apimeta.SetStatusCondition(conds, miss)
}

func named(pods []Pod, total int) string {
	parts := make([]string, 0, len(pods))
	for _, p := range pods {
		parts = append(parts, fmt.Sprintf("%s/%s (%s)", p.Namespace, p.Name, p.Reason))
	}
	out := strings.Join(parts, "; ")
	if total > len(pods) {
		out += fmt.Sprintf("; and %d more", total-len(pods))
	}
	return out
}

// OutageNote relates a missing pod's creation time to the injector's
// reachability as its conditions record it (WebhookReachable, else
// ServerAvailable): "" when they say nothing useful. A pod created while
// the condition is False, or before it last became True, was most likely
// created during an outage (failurePolicy Ignore lets such pods through
// without the sidecars).
func OutageNote(created time.Time, conds []metav1.Condition) string {
	c := apimeta.FindStatusCondition(conds, v1alpha1.ConditionWebhookReachable)
	if c == nil || c.Status == metav1.ConditionUnknown {
		c = apimeta.FindStatusCondition(conds, v1alpha1.ConditionServerAvailable)
	}
	if c == nil || c.LastTransitionTime.IsZero() {
		return ""
	}
	at := c.LastTransitionTime.UTC().Format(time.RFC3339)
	switch {
	case c.Status == metav1.ConditionFalse && !created.Before(c.LastTransitionTime.Time):
		return fmt.Sprintf("created while %s is False (since %s, %s): during an outage", c.Type, at, c.Reason)
	case c.Status == metav1.ConditionTrue && created.Before(c.LastTransitionTime.Time):
		return fmt.Sprintf("created %s before %s last became True (%s): likely during an outage or before the injector",
			c.LastTransitionTime.Sub(created).Round(time.Second), c.Type, at)
	case c.Status == metav1.ConditionTrue:
		return fmt.Sprintf("created after %s last became True (%s): not during a recorded outage", c.Type, at)
	}
	return ""
}

// NamespaceKey is all Classify reads of a namespace for one injector
// (sidecar.NamespaceKey): the same pod in namespaces with equal keys
// classifies alike.
type NamespaceKey = sidecar.NamespaceKey

// KeyOfNamespace is ns's NamespaceKey for inj (sidecar.KeyOfNamespace),
// with nsLabels as Classify takes them.
func KeyOfNamespace(inj Injector, ns string, nsLabels map[string]string) NamespaceKey {
	return sidecar.KeyOfNamespace(inj.Config, inj.Params, ns, nsLabels)
}
