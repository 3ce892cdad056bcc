package fleet

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// Way is how a running pod reaches an injector's current revision.
type Way string

// Ways a running pod reaches the current revision.
const (
	// NoChange: the pod is current, or the injector does not concern it.
	NoChange Way = "None"
	// InPlace: only images and/or resources of injected containers (and of
	// native sidecars, restartable init containers) differ; the API server
	// lets a running pod's images change (ValidatePodUpdate) and resources
	// change through the resize subresource (KEP-1287).
	InPlace Way = "InPlace"
	// Restart: anything else, or sidecars to add or remove: the API server
	// forbids adding or removing containers, so only a new pod (its owner's
	// rollout) gets them.
	Restart Way = "Restart"
)

// Diff kinds of one container.
const (
	Added   = "Added"
	Removed = "Removed"
	Changed = "Changed"
)

// FieldChange is one compared field of a container: image, resources,
// env (one entry per variable), command, args or restartPolicy. Old and New
// are the values as text ("" when absent).
type FieldChange struct {
	Field string `json:"field"`
	Old   string `json:"old,omitempty"`
	New   string `json:"new,omitempty"`
}

// ContainerDiff is one injected container that differs between the pod and
// what the injector would inject now.
type ContainerDiff struct {
	Name string `json:"name"`
	// List is "containers" or "initContainers".
	List string `json:"list"`
	// Kind is Added, Removed or Changed.
	Kind    string        `json:"kind"`
	Changes []FieldChange `json:"changes,omitempty"`
}

// Plan is what an injector would change on one running pod.
type Plan struct {
	Pod
	// Counted is false for a pod Classify does not count (not matched, a
	// finished pod, another injector's); State is then empty.
	Counted bool `json:"counted"`
	// Rule is the deciding rule of sidecar.Decide for the pod without the
	// record of its injection: why it would (or would not) be injected today.
	Rule string `json:"rule"`
	Way  Way    `json:"way"`
	// Why says why Way, in one sentence.
	Why string `json:"why"`
	// Containers are the injected containers that differ.
	Containers []ContainerDiff `json:"containers,omitempty"`
	// Want is the engine's output for the pod (set for outdated and
	// missing pods): what a rollout changes the pod to.
	Want *Injected `json:"-"`
}

// PlanPod classifies pod for inj (Classify) and, for a pod not current,
// tells what would change and how. The containers the current revision
// would inject are the engine's own sidecar.Inject on the pod with the
// injected containers, volumes and image pull secrets its status annotation
// records (and that annotation and the revision label) removed: the pod as
// its owner created it. Compared are image, resources (semantic quantity
// equality), env, command, args and restartPolicy; other fields (probes,
// ports, volumes) are not, as the API server defaults them on a running pod.
// An outdated pod with none of the compared fields different is judged
// Restart (the difference lies in a field only a new pod gets). The error is
// Inject's (a template that fails on this pod).
func PlanPod(inj Injector, pod *corev1.Pod, nsLabels map[string]string) (Plan, error) {
	p, ok := Classify(inj, pod, nsLabels)
	if !ok {
		out := Plan{Pod: Pod{Namespace: pod.Namespace, Name: pod.Name, Created: pod.CreationTimestamp.Time}, Way: NoChange}
		out.Why = notCountedReason(inj, pod, nsLabels)
		out.Rule = out.Why
		return out, nil
	}
	bare := pod.DeepCopy()
	delete(bare.Annotations, v1alpha1.SidecarStatusKey)
	rule := sidecar.Decide(inj.Config, inj.Params, sidecar.DecideInput{Pod: bare, Namespace: pod.Namespace, NamespaceLabels: nsLabels})
	out := Plan{Pod: p, Counted: true, Rule: rule.Reason}
	switch p.State {
	case Current:
		out.Way, out.Why = NoChange, "carries the current revision"
		return out, nil
	case Orphaned:
		st := podStatus(pod)
		for _, n := range st.InitContainers {
			out.Containers = append(out.Containers, ContainerDiff{Name: n, List: "initContainers", Kind: Removed})
		}
		for _, n := range st.Containers {
			out.Containers = append(out.Containers, ContainerDiff{Name: n, List: "containers", Kind: Removed})
		}
		out.Way, out.Why = Restart, "a new pod would not get the sidecars; containers cannot be removed from a running pod"
		return out, nil
	}
	want, err := wouldInject(inj, pod)
	if err != nil {
		return out, err
	}
	out.Containers = DiffSidecars(pod, want)
	out.Want = &want
	if p.State == Missing {
		out.Way, out.Why = Restart, "sidecars to add; containers cannot be added to a running pod"
		return out, nil
	}
	out.Way, out.Why = Judge(out.Containers, want)
	return out, nil
}

// notCountedReason is the deciding rule for a pod Classify does not count.
func notCountedReason(inj Injector, pod *corev1.Pod, nsLabels map[string]string) string {
	if pod.DeletionTimestamp != nil {
		return "being deleted"
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return "finished (" + string(pod.Status.Phase) + ")"
	}
	d := sidecar.Decide(inj.Config, inj.Params, sidecar.DecideInput{Pod: pod, Namespace: pod.Namespace, NamespaceLabels: nsLabels})
	return "not matched: " + d.Reason
}

func podStatus(pod *corev1.Pod) sidecar.Status {
	var st sidecar.Status
	_ = json.Unmarshal([]byte(pod.Annotations[v1alpha1.SidecarStatusKey]), &st)
	return st
}

// Strip is pod without what this injector's status annotation says it
// added: those containers, init containers, volumes and image pull
// secrets, the status annotation and the revision label. pod is not
// changed.
func Strip(pod *corev1.Pod) *corev1.Pod {
	st := podStatus(pod)
	out := pod.DeepCopy()
	delete(out.Annotations, v1alpha1.SidecarStatusKey)
	delete(out.Labels, v1alpha1.SidecarRevisionKey)
	out.Spec.InitContainers = slices.DeleteFunc(out.Spec.InitContainers, func(c corev1.Container) bool { return slices.Contains(st.InitContainers, c.Name) })
	out.Spec.Containers = slices.DeleteFunc(out.Spec.Containers, func(c corev1.Container) bool { return slices.Contains(st.Containers, c.Name) })
	out.Spec.Volumes = slices.DeleteFunc(out.Spec.Volumes, func(v corev1.Volume) bool { return slices.Contains(st.Volumes, v.Name) })
	out.Spec.ImagePullSecrets = slices.DeleteFunc(out.Spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool {
		return slices.Contains(st.ImagePullSecrets, r.Name)
	})
	return out
}

// Injected is what the engine would inject into a pod: the pod it returns
// and the containers it records.
type Injected struct {
	Pod    *corev1.Pod
	Status sidecar.Status
}

func wouldInject(inj Injector, pod *corev1.Pod) (Injected, error) {
	raw, err := json.Marshal(Strip(pod))
	if err != nil {
		return Injected{}, err
	}
	res, err := sidecar.Inject(inj.Config, inj.Params, sidecar.Input{Raw: raw, Namespace: pod.Namespace, WantJSON: true})
	if err != nil {
		return Injected{}, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if !res.Injected {
		// Classify said it matches; Inject found no template to render.
		return Injected{Pod: Strip(pod)}, nil
	}
	got := &corev1.Pod{}
	if err := json.Unmarshal(res.JSON, got); err != nil {
		return Injected{}, err
	}
	return Injected{Pod: got, Status: *res.Status}, nil
}

// DiffSidecars compares the injected containers pod carries (its status
// annotation's) with those of want (the engine's output for the same pod),
// by list and name: init containers first, then containers, each in the
// order of the pod, then of want.
func DiffSidecars(pod *corev1.Pod, want Injected) []ContainerDiff {
	st := podStatus(pod)
	var out []ContainerDiff
	out = append(out, diffList("initContainers", st.InitContainers, pod.Spec.InitContainers, want.Status.InitContainers, want.Pod.Spec.InitContainers)...)
	out = append(out, diffList("containers", st.Containers, pod.Spec.Containers, want.Status.Containers, want.Pod.Spec.Containers)...)
	return out
}

func diffList(list string, haveNames []string, have []corev1.Container, wantNames []string, want []corev1.Container) []ContainerDiff {
	find := func(cs []corev1.Container, name string) *corev1.Container {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
		return nil
	}
	var out []ContainerDiff
	for _, n := range haveNames {
		h := find(have, n)
		if h == nil {
			continue // a stale record; Decide ignores it too
		}
		if !slices.Contains(wantNames, n) {
			out = append(out, ContainerDiff{Name: n, List: list, Kind: Removed})
			continue
		}
		if ch := DiffContainer(h, find(want, n)); len(ch) > 0 {
			out = append(out, ContainerDiff{Name: n, List: list, Kind: Changed, Changes: ch})
		}
	}
	for _, n := range wantNames {
		if !slices.Contains(haveNames, n) || find(have, n) == nil {
			out = append(out, ContainerDiff{Name: n, List: list, Kind: Added})
		}
	}
	return out
}

// DiffContainer lists the compared fields in which have and want differ.
// want nil (not rendered) is no difference.
func DiffContainer(have, want *corev1.Container) []FieldChange {
	if want == nil {
		return nil
	}
	var out []FieldChange
	if have.Image != want.Image {
		out = append(out, FieldChange{Field: "image", Old: have.Image, New: want.Image})
	}
	if !equality.Semantic.DeepEqual(normResources(have.Resources), normResources(want.Resources)) {
		out = append(out, FieldChange{Field: "resources", Old: resourcesText(have.Resources), New: resourcesText(want.Resources)})
	}
	out = append(out, diffEnv(have.Env, want.Env)...)
	if !slices.Equal(have.Command, want.Command) {
		out = append(out, FieldChange{Field: "command", Old: strings.Join(have.Command, " "), New: strings.Join(want.Command, " ")})
	}
	if !slices.Equal(have.Args, want.Args) {
		out = append(out, FieldChange{Field: "args", Old: strings.Join(have.Args, " "), New: strings.Join(want.Args, " ")})
	}
	if policy(have.RestartPolicy) != policy(want.RestartPolicy) {
		out = append(out, FieldChange{Field: "restartPolicy", Old: policy(have.RestartPolicy), New: policy(want.RestartPolicy)})
	}
	return out
}

func policy(p *corev1.ContainerRestartPolicy) string {
	if p == nil {
		return ""
	}
	return string(*p)
}

// normResources drops empty maps so nil and {} compare equal, and gives
// a resource with a limit and no request the limit as request, as the API
// server defaults a pod (SetDefaults_Pod, pkg/apis/core/v1/defaults.go).
func normResources(r corev1.ResourceRequirements) corev1.ResourceRequirements {
	out := corev1.ResourceRequirements{Claims: r.Claims}
	if len(r.Limits) > 0 {
		out.Limits = r.Limits
	}
	for k, v := range r.Limits {
		if _, ok := r.Requests[k]; !ok {
			if out.Requests == nil {
				out.Requests = maps.Clone(r.Requests)
				if out.Requests == nil {
					out.Requests = corev1.ResourceList{}
				}
			}
			out.Requests[k] = v
		}
	}
	if out.Requests == nil && len(r.Requests) > 0 {
		out.Requests = r.Requests
	}
	return out
}

// normEnv gives a fieldRef without apiVersion "v1", as the API server
// defaults it (SetDefaults_ObjectFieldSelector), so a rendered env compares
// equal to the stored one.
func normEnv(e corev1.EnvVar) corev1.EnvVar {
	if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.APIVersion == "" {
		e = *e.DeepCopy()
		e.ValueFrom.FieldRef.APIVersion = "v1"
	}
	return e
}

func resourcesText(r corev1.ResourceRequirements) string {
	part := func(label string, l corev1.ResourceList) string {
		if len(l) == 0 {
			return ""
		}
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(l)) {
			q := l[k]
			kv = append(kv, string(k)+"="+q.String())
		}
		return label + " " + strings.Join(kv, ",")
	}
	return strings.TrimSpace(part("requests", r.Requests) + " " + part("limits", r.Limits))
}

func envText(e *corev1.EnvVar) string {
	if e == nil {
		return ""
	}
	if e.ValueFrom != nil {
		b, _ := json.Marshal(e.ValueFrom)
		return "valueFrom " + string(b)
	}
	return e.Value
}

func normEnvs(es []corev1.EnvVar) []corev1.EnvVar {
	if len(es) == 0 {
		return nil
	}
	out := make([]corev1.EnvVar, len(es))
	for i, e := range es {
		out[i] = normEnv(e)
	}
	return out
}

// diffEnv compares env by name (one FieldChange "env NAME" per variable
// added, removed or changed) and reports a reordering as "env order".
func diffEnv(have, want []corev1.EnvVar) []FieldChange {
	have, want = normEnvs(have), normEnvs(want)
	find := func(es []corev1.EnvVar, name string) *corev1.EnvVar {
		for i := range es {
			if es[i].Name == name {
				return &es[i]
			}
		}
		return nil
	}
	var out []FieldChange
	for i := range have {
		w := find(want, have[i].Name)
		if w == nil || !equality.Semantic.DeepEqual(have[i], *w) {
			out = append(out, FieldChange{Field: "env " + have[i].Name, Old: envText(&have[i]), New: envText(w)})
		}
	}
	for i := range want {
		if find(have, want[i].Name) == nil {
			out = append(out, FieldChange{Field: "env " + want[i].Name, New: envText(&want[i])})
		}
	}
	if len(out) == 0 && !equality.Semantic.DeepEqual(have, want) {
		// Same variables in another order: $(VAR) references depend on it.
		out = append(out, FieldChange{Field: "env order"})
	}
	return out
}

// Judge tells whether the differences of an outdated pod can be made in
// place: only when every one is the image or the resources of a container
// or of a restartable init container (a native sidecar) present on both
// sides. An init container that is not restartable has already run, so a
// change to it takes effect only in a new pod. No compared difference at
// all is Restart too: the revision differs in a field not compared.
func Judge(diffs []ContainerDiff, want Injected) (Way, string) {
	if len(diffs) == 0 {
		return Restart, "the revision differs outside the compared fields (image, resources, env, command, args), which only a new pod gets"
	}
	for _, d := range diffs {
		if d.Kind != Changed {
			return Restart, fmt.Sprintf("%s %s is %s; containers cannot be added to or removed from a running pod", d.List, d.Name, strings.ToLower(d.Kind))
		}
		if d.List == "initContainers" && !restartable(want.Pod.Spec.InitContainers, d.Name) {
			return Restart, fmt.Sprintf("init container %s has already run; its change takes effect only in a new pod", d.Name)
		}
		for _, c := range d.Changes {
			if c.Field != "image" && c.Field != "resources" {
				return Restart, fmt.Sprintf("%s %s changes %s, which a running pod cannot change", d.List, d.Name, c.Field)
			}
		}
	}
	return InPlace, "only images and/or resources of injected containers differ (image patch, resize subresource)"
}

func restartable(cs []corev1.Container, name string) bool {
	for _, c := range cs {
		if c.Name == name {
			return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		}
	}
	return false
}

// DiffLines is diffs as text, one line per container and one per changed
// field ("containers/proxy changed: image proxy:1 -> proxy:2").
func DiffLines(diffs []ContainerDiff) []string {
	var out []string
	for _, d := range diffs {
		head := d.List + "/" + d.Name + " " + strings.ToLower(d.Kind)
		if len(d.Changes) == 0 {
			out = append(out, head)
			continue
		}
		for _, c := range d.Changes {
			out = append(out, fmt.Sprintf("%s: %s %s -> %s", head, c.Field, orNone(c.Old), orNone(c.New)))
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
