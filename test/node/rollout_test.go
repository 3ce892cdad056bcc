package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/test/cluster"
)

// The images of the sample SidecarInjector and of the lab's Deployment
// (`kubectl create deployment test --image=nginx:1.23-alpine`), served by
// the test's registry under their own names (TestMain mirrors their
// registries to it).
const (
	rolloutProxy    = "ghcr.io/hookwright/proxy:1.4.2"
	rolloutProxyNew = "ghcr.io/hookwright/proxy:1.4.3"
	rolloutProxyBad = "ghcr.io/hookwright/proxy:does-not-exist"
	rolloutNginx    = "nginx:1.23-alpine"
	rolloutNS       = "rollout"
	rolloutApp      = "web"
	rolloutEnv      = "HOOKWRIGHT_ROLLOUT"
)

// injectorEnv finds the sample proxy template's env entry INJECTOR.
var injectorEnv = regexp.MustCompile(`(?m)^( *)- name: INJECTOR\n`)

var (
	standinsOnce sync.Once
	standinsErr  error
)

// pushStandins builds hack/ociimage's standins set (nginx, the proxy
// in both versions, proxy-init, ...) and pushes it to the test's
// registry, once for the package: what the demo's registry serves.
func pushStandins(ctx context.Context, t *testing.T) {
	t.Helper()
	standinsOnce.Do(func() {
		root, err := cluster.RepoRoot()
		if err != nil {
			standinsErr = err
			return
		}
		imgs, err := ociimage.Build(ctx, ociimage.Options{Root: root, BinDir: filepath.Join(node.Dir, "standin-images")}, ociimage.SetStandins)
		if err != nil {
			standinsErr = err
			return
		}
		standinsErr = ociimage.Push(ctx, registryAddr, imgs...)
	})
	if standinsErr != nil {
		t.Fatalf("stand-in images: %v", standinsErr)
	}
}

// containerStatus is a container's status, regular or init (a native
// sidecar's is among the init containers').
func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	return named(name, func(s *corev1.ContainerStatus) string { return s.Name }, p.Status.ContainerStatuses, p.Status.InitContainerStatuses)
}

// named is the first element of lists whose nameOf is name, or nil.
func named[T any](name string, nameOf func(*T) string, lists ...[]T) *T {
	for _, l := range lists {
		for i := range l {
			if nameOf(&l[i]) == name {
				return &l[i]
			}
		}
	}
	return nil
}

// inFlightWhy says why the rollout test counts p, whose proxy status is
// st, in flight: its proxy not restarted or not Ready, or the pod not
// Ready (webReady), with the Ready condition's last transition.
func inFlightWhy(p *corev1.Pod, st *corev1.ContainerStatus, restartsBefore int32) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s resourceVersion %s", p.Name, p.ResourceVersion)
	if st == nil {
		b.WriteString(": no proxy status")
	} else {
		fmt.Fprintf(&b, ": proxy restartCount %d (before %d) ready %t started %v running %t", st.RestartCount, restartsBefore, st.Ready, st.Started != nil && *st.Started, st.State.Running != nil)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			fmt.Fprintf(&b, ", %s %s since %s", c.Type, c.Status, c.LastTransitionTime.UTC().Format("15:04:05"))
		}
	}
	if why := webReady(p); why != "" {
		b.WriteString(", " + why)
	}
	return b.String()
}

// specContainer is the container of p's spec, regular or init, named
// name.
func specContainer(p *corev1.Pod, name string) *corev1.Container {
	return named(name, func(c *corev1.Container) string { return c.Name }, p.Spec.Containers, p.Spec.InitContainers)
}

// podSnap is what the test compares of a pod before and after a change.
type podSnap struct {
	uid                      types.UID
	proxyImage               string
	proxyRestarts, nginxRest int32
}

// snaps is a podSnap of each of pods, by name.
func snaps(pods []corev1.Pod) map[string]podSnap {
	m := map[string]podSnap{}
	for i := range pods {
		m[pods[i].Name] = snap(&pods[i])
	}
	return m
}

// webSnaps is snaps of the web pods now.
func webSnaps(ctx context.Context, t *testing.T) map[string]podSnap {
	t.Helper()
	pods, err := webPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return snaps(pods)
}

func snap(p *corev1.Pod) podSnap {
	s := podSnap{uid: p.UID}
	if c := specContainer(p, "proxy"); c != nil {
		s.proxyImage = c.Image
	}
	if st := containerStatus(p, "proxy"); st != nil {
		s.proxyRestarts = st.RestartCount
	}
	if st := containerStatus(p, "nginx"); st != nil {
		s.nginxRest = st.RestartCount
	}
	return s
}

// webPods lists the Deployment's pods that are not being deleted.
func webPods(ctx context.Context) ([]corev1.Pod, error) {
	var l corev1.PodList
	if err := env.Client.List(ctx, &l, client.InNamespace(rolloutNS), client.MatchingLabels{"app": rolloutApp}); err != nil {
		return nil, err
	}
	out := slices.DeleteFunc(l.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	slices.SortFunc(out, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// webReady says why p is not Running with nginx and the proxy native
// sidecar ready and proxy-init completed ("" when it is).
func webReady(p *corev1.Pod) string {
	if p.Status.Phase != corev1.PodRunning || !cluster.PodReady(p) {
		return fmt.Sprintf("pod %s %s, Ready %t", p.Name, p.Status.Phase, cluster.PodReady(p))
	}
	for _, n := range []string{"nginx", "proxy"} {
		st := containerStatus(p, n)
		if st == nil || !st.Ready || st.State.Running == nil {
			return fmt.Sprintf("pod %s: %s not ready: %+v", p.Name, n, st)
		}
	}
	if st := containerStatus(p, "proxy-init"); st == nil || st.State.Terminated == nil || st.State.Terminated.ExitCode != 0 {
		return fmt.Sprintf("pod %s: proxy-init %+v", p.Name, st)
	}
	return ""
}

// fleetLine is the CR's `kubectl get sidecarinjectors` columns.
func fleetLine(si *v1alpha1.SidecarInjector) string {
	ready := "?"
	if c := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		ready = string(c.Status)
	}
	f := si.Status.Fleet
	if f == nil {
		return "READY " + ready + " (no status.fleet)"
	}
	return fmt.Sprintf("READY %s MATCHED %d CURRENT %d OUTDATED %d MISSING %d", ready, f.MatchedPods, f.CurrentPods, f.OutdatedPods, f.MissingPods)
}

func rolloutCond(si *v1alpha1.SidecarInjector) *metav1.Condition {
	return apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionRolloutBlocked)
}

// describeSI is what a failed wait prints of the CR.
func describeSI(si *v1alpha1.SidecarInjector) string {
	b, _ := json.Marshal(si.Status.Rollout)
	var conds []string
	for _, c := range si.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return fmt.Sprintf("generation %d, revision %s, %s\nstatus.rollout %s\nconditions:\n  %s",
		si.Generation, si.Status.Revision, fleetLine(si), b, strings.Join(conds, "\n  "))
}

func describePods(ctx context.Context) string {
	pods, err := webPods(ctx)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for i := range pods {
		p := &pods[i]
		fmt.Fprintf(&b, "pod %s uid %s revision %s rollout %q:", p.Name, p.UID, p.Labels[v1alpha1.SidecarRevisionKey], p.Annotations[v1alpha1.SidecarRolloutKey])
		for _, n := range []string{"proxy", "nginx"} {
			c, st := specContainer(p, n), containerStatus(p, n)
			if c == nil || st == nil {
				fmt.Fprintf(&b, " %s missing;", n)
				continue
			}
			fmt.Fprintf(&b, " %s image %s restarts %d ready %t state %+v;", n, c.Image, st.RestartCount, st.Ready, st.State)
		}
		b.WriteString("\n")
		// The kubelet's Events on the pod (pull failures, back-offs).
		var evs corev1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(p.Namespace), client.MatchingFields{"involvedObject.uid": string(p.UID)}); err == nil {
			for _, e := range evs.Items {
				if e.Type == corev1.EventTypeWarning || strings.Contains(e.Message, "image") {
					fmt.Fprintf(&b, "  event %s %s x%d: %s\n", e.Type, e.Reason, e.Count, e.Message)
				}
			}
		}
	}
	return b.String()
}

// waitRollout polls the CR and the Deployment's pods until ok holds.
func waitRollout(ctx context.Context, t *testing.T, what string, d time.Duration, ok func(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string)) (*v1alpha1.SidecarInjector, []corev1.Pod) {
	t.Helper()
	si := &v1alpha1.SidecarInjector{}
	var pods []corev1.Pod
	var why string
	err := cluster.WaitFor(ctx, d, what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "rollout"}, si); err != nil {
			return false, err
		}
		var err error
		if pods, err = webPods(ctx); err != nil {
			return false, err
		}
		var done bool
		done, why = ok(si, pods)
		return done, nil
	})
	if err != nil {
		t.Fatalf("%v (%s)\n%s\n%s", err, why, describeSI(si), describePods(ctx))
	}
	return si, pods
}

func patchSI(ctx context.Context, t *testing.T, patch string) {
	t.Helper()
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "rollout"}}
	if err := env.Client.Patch(ctx, si, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("patch SidecarInjector %s: %v", patch, err)
	}
}

// complete is a rollout that reached the CR's revision with every pod
// current and none in flight.
func complete(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string) {
	c := rolloutCond(si)
	f := si.Status.Fleet
	switch {
	case si.Status.ObservedGeneration != si.Generation:
		return false, "CR generation not observed yet"
	case c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Complete" || c.ObservedGeneration != si.Generation:
		return false, fmt.Sprintf("RolloutBlocked %+v", c)
	case f == nil || f.CurrentPods != 2 || f.OutdatedPods != 0 || f.MissingPods != 0:
		return false, fleetLine(si)
	case si.Status.Rollout == nil || si.Status.Rollout.Revision != si.Status.Revision || si.Status.Rollout.Updated != 2:
		return false, "status.rollout not at the revision"
	case len(pods) != 2:
		return false, fmt.Sprintf("%d pods", len(pods))
	}
	for i := range pods {
		if pods[i].Labels[v1alpha1.SidecarRevisionKey] != si.Status.Revision {
			return false, "pod " + pods[i].Name + " not at the revision"
		}
		if _, ok := pods[i].Annotations[v1alpha1.SidecarRolloutKey]; ok {
			return false, "pod " + pods[i].Name + " still carries its rollout record"
		}
		if why := webReady(&pods[i]); why != "" {
			return false, why
		}
	}
	return true, ""
}

// TestRolloutOnTheRealNode rolls the sample SidecarInjector's proxy
// through lab-like nginx pods (a Deployment of 2, the proxy a native
// sidecar) on the real kubelet and containerd:
//   - InPlace, image 1.4.2 -> 1.4.3: the pods keep their UID, the proxy
//     restarts once, nginx not at all; status.fleet goes from outdated to
//     current; the time from the rollout's patch to Ready is the figure;
//   - InPlace, resources only: resized through pods/resize, no restart,
//     the kubelet's status reports the new resources;
//   - Restart, a new env var: blocked while a PodDisruptionBudget allows no
//     disruption (RolloutBlocked DisruptionBudget naming it), the
//     Deployment restarted once it does;
//   - InPlace, an image that cannot be pulled: the rollout stops after the
//     first pod with the kubelet's reason, the other pod untouched, and
//     resumes when the CR changes.
func TestRolloutOnTheRealNode(t *testing.T) {
	// Beside TestInjectorZeroDropThroughServerRestarts and
	// TestOversellServerFrozen: its SidecarInjector selects only its own
	// namespace, it restarts no kubelet and adds no webhook on the node,
	// and it mostly waits for pods.
	t.Parallel()
	ctx := cluster.TestContext(t, 25*time.Minute)
	startOperator(t)
	pushOperatorImage(ctx, t)
	pushStandins(ctx, t)

	if _, err := env.CreateNamespace(ctx, rolloutNS, map[string]string{"rollout.test.hookwright.io": "enabled"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamespace(t, rolloutNS) })
	si := cluster.SampleInjector(t, "rollout")
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rollout.test.hookwright.io": "enabled"}}
	si.Spec.NativeSidecars = v1alpha1.NativeSidecarEnabled
	si.Spec.Server.Replicas = ptr.To[int32](1)
	templates := si.Spec.Templates
	if err := env.Client.Create(ctx, si); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, si) })
	waitCondition(ctx, t, si, func() []metav1.Condition { return si.Status.Conditions }, v1alpha1.ConditionReady,
		func(c *metav1.Condition) bool {
			return c.Status == metav1.ConditionTrue && c.ObservedGeneration == si.Generation
		}, 4*time.Minute)

	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: rolloutNS, Name: rolloutApp, Labels: map[string]string{"app": rolloutApp}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": rolloutApp}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": rolloutApp}},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name: "nginx", Image: rolloutNginx,
						Ports: []corev1.ContainerPort{{ContainerPort: 80}},
					}},
				},
			},
		},
	}
	if err := env.Client.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	si, pods := waitRollout(ctx, t, "2 pods injected, Ready, counted current", 4*time.Minute, func(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string) {
		if len(pods) != 2 {
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		for i := range pods {
			c := specContainer(&pods[i], "proxy")
			if c == nil || c.Image != rolloutProxy || c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				return false, "pod " + pods[i].Name + " has no proxy " + rolloutProxy + " native sidecar"
			}
			if why := webReady(&pods[i]); why != "" {
				return false, why
			}
		}
		f := si.Status.Fleet
		return f != nil && f.MatchedPods == 2 && f.CurrentPods == 2, fleetLine(si)
	})
	if si.Status.Rollout != nil || rolloutCond(si) != nil {
		t.Errorf("strategy None: status.rollout %+v, RolloutBlocked %+v; want neither", si.Status.Rollout, rolloutCond(si))
	}
	t.Logf("lab-like pods injected with %s: %s", rolloutProxy, fleetLine(si))

	t.Run("in-place image", func(t *testing.T) { rolloutInPlaceImage(ctx, t, pods) })
	t.Run("in-place resize", func(t *testing.T) { rolloutInPlaceResize(ctx, t) })
	t.Run("restart under a PodDisruptionBudget", func(t *testing.T) { rolloutRestartPDB(ctx, t, templates) })
	t.Run("image that cannot be pulled", func(t *testing.T) { rolloutBadImage(ctx, t) })
}

func rolloutInPlaceImage(ctx context.Context, t *testing.T, pods []corev1.Pod) {
	before := snaps(pods)
	oldRev := pods[0].Labels[v1alpha1.SidecarRevisionKey]

	// Paused first: the new revision is counted outdated, nothing touched.
	patchSI(ctx, t, `{"spec":{"values":{"proxy":{"image":"`+rolloutProxyNew+`"}},"rollout":{"strategy":"InPlace","maxUnavailable":1,"paused":true}}}`)
	si, _ := waitRollout(ctx, t, "paused: 2 outdated", 2*time.Minute, func(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string) {
		c := rolloutCond(si)
		f := si.Status.Fleet
		if c == nil || c.Reason != "Paused" || c.Status != metav1.ConditionFalse || c.ObservedGeneration != si.Generation {
			return false, fmt.Sprintf("RolloutBlocked %+v", c)
		}
		return f != nil && f.OutdatedPods == 2 && f.CurrentPods == 0, fleetLine(si)
	})
	t.Logf("proxy image %s, rollout paused: %s; RolloutBlocked False Paused: %s", rolloutProxyNew, fleetLine(si), rolloutCond(si).Message)
	now, err := webPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range now {
		if s := snap(&now[i]); s != before[now[i].Name] {
			t.Errorf("paused rollout touched pod %s: %+v, was %+v", now[i].Name, s, before[now[i].Name])
		}
	}

	// Unpaused: one pod at a time (maxUnavailable 1), each measured from
	// the rollout's record ("at", whole seconds) and from the first poll
	// that saw its new image, to Ready again.
	type upgrade struct{ at, seen, ready time.Time }
	ups := map[string]*upgrade{}
	for n := range before {
		ups[n] = &upgrade{}
	}
	var counts []string
	maxInFlight := 0
	var firstOver string
	// The record leaves a pod once it is done, which a poll can miss on a
	// loaded machine: every write of the pods is watched for it.
	pl, err := env.Clientset.CoreV1().Pods(rolloutNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + rolloutApp})
	if err != nil {
		t.Fatal(err)
	}
	records := watchRecords(ctx, pl.ResourceVersion, oldRev, slices.Collect(maps.Keys(before)))
	patchSI(ctx, t, `{"spec":{"rollout":{"paused":false}}}`)
	unpaused := time.Now()
	si = &v1alpha1.SidecarInjector{}
	var why string
	_, err = cluster.Poll(ctx, 25*time.Millisecond, 4*time.Minute, "in-place rollout to "+rolloutProxyNew, func(ctx context.Context) (bool, error) {
		pods, err := webPods(ctx)
		if err != nil {
			return false, err
		}
		seenAt := time.Now()
		inFlight := 0
		var whyInFlight []string
		for i := range pods {
			p := &pods[i]
			u, ok := ups[p.Name]
			if !ok {
				return false, cluster.Permanent(fmt.Errorf("new pod %s: the in-place rollout replaced a pod", p.Name))
			}
			if c := specContainer(p, "proxy"); c != nil && c.Image == rolloutProxyNew && u.seen.IsZero() {
				u.seen = seenAt
			}
			if !u.seen.IsZero() && u.ready.IsZero() {
				st := containerStatus(p, "proxy")
				if st != nil && st.RestartCount > before[p.Name].proxyRestarts && st.Ready && webReady(p) == "" {
					u.ready = seenAt
				} else {
					inFlight++
					whyInFlight = append(whyInFlight, inFlightWhy(p, st, before[p.Name].proxyRestarts))
				}
			}
		}
		if inFlight > maxInFlight && inFlight > 1 {
			// What the poll that saw the most pods in flight saw of each.
			firstOver = fmt.Sprintf("%s after unpausing (first pod's resourceVersion %s): %s",
				seenAt.Sub(unpaused).Round(time.Millisecond), pods[0].ResourceVersion, strings.Join(whyInFlight, "; "))
		}
		maxInFlight = max(maxInFlight, inFlight)
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "rollout"}, si); err != nil {
			return false, err
		}
		if l := fleetLine(si); len(counts) == 0 || counts[len(counts)-1] != l {
			counts = append(counts, l)
		}
		var done bool
		done, why = complete(si, pods)
		return done, nil
	})
	if err != nil {
		t.Fatalf("%v (%s)\n%s\n%s", err, why, describeSI(si), describePods(ctx))
	}
	t.Logf("figure: in-place rollout of 2 pods, unpaused -> complete %s; status.fleet went %s",
		time.Since(unpaused).Round(time.Millisecond), strings.Join(counts, " -> "))
	for n, at := range records(time.Minute) {
		if u := ups[n]; u != nil {
			u.at = at
		}
	}
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range ups {
			if !yield(n) {
				return
			}
		}
	}) {
		u := ups[n]
		if u.at.IsZero() || u.ready.IsZero() {
			t.Errorf("pod %s: rollout record at %v, Ready seen %v", n, u.at, u.ready)
			continue
		}
		t.Logf("figure: in-place upgrade %s -> %s, pod %s: rollout annotation at -> Ready %s (at is whole seconds); new image seen in the pod -> Ready %s (unpaused -> image seen %s)",
			rolloutProxy, rolloutProxyNew, n, u.ready.Sub(u.at).Round(time.Millisecond), u.ready.Sub(u.seen).Round(time.Millisecond),
			u.seen.Sub(unpaused).Round(time.Millisecond))
	}
	// The pause between one pod Ready and the next pod's patch is the
	// controller's, not the kubelet's.
	var order []*upgrade
	for _, u := range ups {
		order = append(order, u)
	}
	slices.SortFunc(order, func(a, b *upgrade) int { return a.seen.Compare(b.seen) })
	if len(order) == 2 && !order[0].ready.IsZero() && !order[1].seen.IsZero() {
		t.Logf("figure: first pod Ready -> second pod's new image seen %s (maxUnavailable 1)", order[1].seen.Sub(order[0].ready).Round(time.Millisecond))
	}
	if maxInFlight > 1 {
		t.Errorf("%d pods in flight at once, maxUnavailable 1: %s", maxInFlight, firstOver)
	}
	after, err := webPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range after {
		p := &after[i]
		b, s := before[p.Name], snap(p)
		if s.uid != b.uid {
			t.Errorf("pod %s: UID %s, was %s", p.Name, s.uid, b.uid)
		}
		if s.proxyRestarts != b.proxyRestarts+1 {
			t.Errorf("pod %s: proxy restartCount %d, want %d+1", p.Name, s.proxyRestarts, b.proxyRestarts)
		}
		if s.nginxRest != b.nginxRest {
			t.Errorf("pod %s: nginx restartCount %d, was %d", p.Name, s.nginxRest, b.nginxRest)
		}
		if st := containerStatus(p, "proxy"); st == nil || !strings.HasSuffix(st.Image, "proxy:1.4.3") {
			t.Errorf("pod %s: the kubelet runs proxy image %+v, want %s", p.Name, st, rolloutProxyNew)
		}
	}
	t.Logf("pods %s and %s kept their UIDs; proxy restartCount +1, nginx unchanged, both Ready; %s",
		after[0].Name, after[1].Name, fleetLine(si))
}

// watchRecords watches every write of the pods of deployment web from
// resourceVersion rv for the rollout record (fleet.Record) of a revision
// other than oldRev, which the operator removes once a pod is done. The
// function it returns waits until each pod of names has shown one, or
// timeout, stops the watch and returns each pod's first record time.
func watchRecords(ctx context.Context, rv, oldRev string, names []string) func(timeout time.Duration) map[string]time.Time {
	ctx, cancel := context.WithCancel(ctx)
	pods := env.Clientset.CoreV1().Pods(rolloutNS)
	var mu sync.Mutex
	at := map[string]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Its end is seen in at: every pod has a record, or not.
		_ = cluster.Watch(ctx, time.Hour, "rollout records", rv, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = "app=" + rolloutApp
			return pods.Watch(ctx, o)
		}, func(ev watch.Event) (bool, error) {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				return false, nil
			}
			mu.Lock()
			defer mu.Unlock()
			if rec, ok := fleet.ParseRecord(p); ok && rec.Revision != oldRev && at[p.Name].IsZero() {
				at[p.Name] = rec.At
			}
			for _, n := range names {
				if at[n].IsZero() {
					return false, nil
				}
			}
			return true, nil
		})
	}()
	return func(timeout time.Duration) map[string]time.Time {
		select {
		case <-done:
		case <-time.After(timeout):
		}
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(at)
	}
}

func rolloutInPlaceResize(ctx context.Context, t *testing.T) {
	before := webSnaps(ctx, t)
	wantCPU, wantMem := resource.MustParse("100m"), resource.MustParse("320Mi")
	start := time.Now()
	patchSI(ctx, t, `{"spec":{"values":{"proxy":{"resources":{"requests":{"cpu":"100m"},"limits":{"memory":"320Mi"}}}}}}`)
	resized := map[string]time.Duration{}
	si, pods := waitRollout(ctx, t, "proxy resized in place", 4*time.Minute, func(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string) {
		for i := range pods {
			p := &pods[i]
			st := containerStatus(p, "proxy")
			if _, ok := resized[p.Name]; !ok && st != nil && st.Resources != nil &&
				st.Resources.Requests.Cpu().Equal(wantCPU) && st.Resources.Limits.Memory().Equal(wantMem) {
				resized[p.Name] = time.Since(start)
			}
		}
		if ok, why := complete(si, pods); !ok {
			return false, why
		}
		return len(resized) == 2, fmt.Sprintf("%d pods report the new resources", len(resized))
	})
	for i := range pods {
		p := &pods[i]
		b, s := before[p.Name], snap(p)
		if s.uid != b.uid || s.proxyRestarts != b.proxyRestarts || s.nginxRest != b.nginxRest {
			t.Errorf("pod %s after the resize: %+v, was %+v (same UID, no restart wanted)", p.Name, s, b)
		}
		c := specContainer(p, "proxy")
		if !c.Resources.Requests.Cpu().Equal(wantCPU) || !c.Resources.Limits.Memory().Equal(wantMem) {
			t.Errorf("pod %s: proxy spec resources %+v", p.Name, c.Resources)
		}
		st := containerStatus(p, "proxy")
		t.Logf("pod %s (UID %s unchanged): initContainerStatuses[proxy].resources %s; template change -> status resources %s",
			p.Name, p.UID, resourcesText(st.Resources), resized[p.Name].Round(time.Millisecond))
	}
	t.Logf("resize complete: %s", fleetLine(si))
}

func resourcesText(r *corev1.ResourceRequirements) string {
	if r == nil {
		return "<none>"
	}
	return fmt.Sprintf("requests cpu %s memory %s, limits memory %s", r.Requests.Cpu(), r.Requests.Memory(), r.Limits.Memory())
}

func rolloutRestartPDB(ctx context.Context, t *testing.T, templates []v1alpha1.NamedTemplate) {
	pods, err := webPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := map[types.UID]bool{}
	for _, p := range pods {
		old[p.UID] = true
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: rolloutNS, Name: rolloutApp},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(2)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": rolloutApp}},
		},
	}
	if err := env.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pdb) })
	waitPDB(ctx, t, pdb, 0)

	// The proxy template with one more env var (not possible in place),
	// strategy Restart.
	ts := slices.Clone(templates)
	for i := range ts {
		if ts[i].Name == "proxy" {
			// The env entry INJECTOR, at whatever indentation the
			// template has it: the new one goes before it.
			m := injectorEnv.FindStringSubmatchIndex(ts[i].Template)
			if m == nil {
				t.Fatalf("the sample's proxy template has no env entry INJECTOR:\n%s", ts[i].Template)
			}
			indent := ts[i].Template[m[2]:m[3]]
			ts[i].Template = ts[i].Template[:m[0]] + indent + "- name: " + rolloutEnv + "\n" + indent + "  value: \"restart\"\n" + ts[i].Template[m[0]:]
		}
	}
	b, err := json.Marshal(map[string]any{"spec": map[string]any{"templates": ts,
		"rollout": map[string]any{"strategy": "Restart", "maxUnavailable": 1, "paused": false}}})
	if err != nil {
		t.Fatal(err)
	}
	patchSI(ctx, t, string(b))
	si, _ := waitRollout(ctx, t, "RolloutBlocked DisruptionBudget", 2*time.Minute, func(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string) {
		c := rolloutCond(si)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "DisruptionBudget" && c.ObservedGeneration == si.Generation, fmt.Sprintf("RolloutBlocked %+v", c)
	})
	c := rolloutCond(si)
	if want := "PodDisruptionBudget " + rolloutNS + "/" + rolloutApp; !strings.Contains(c.Message, want) {
		t.Errorf("RolloutBlocked message %q does not name %s", c.Message, want)
	}
	t.Logf("PDB minAvailable 2 of 2: RolloutBlocked True %s: %s; %s", c.Reason, c.Message, fleetLine(si))
	d := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: rolloutNS, Name: rolloutApp}, d); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Spec.Template.Annotations[v1alpha1.RestartedAtKey]; ok || d.Annotations[v1alpha1.SidecarRestartedForKey] != "" {
		t.Errorf("Deployment restarted while the PDB allows no disruption: %v %v", d.Annotations, d.Spec.Template.Annotations)
	}
	if now, err := webPods(ctx); err != nil || len(now) != 2 || !old[now[0].UID] || !old[now[1].UID] {
		t.Errorf("pods replaced while the PDB allows no disruption (%v)", err)
	}

	// Relaxed to maxUnavailable 1: the Deployment is restarted.
	if err := env.Client.Patch(ctx, pdb, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"minAvailable":null,"maxUnavailable":1}}`))); err != nil {
		t.Fatal(err)
	}
	relaxed := time.Now()
	waitPDB(ctx, t, pdb, 1)
	si, pods = waitRollout(ctx, t, "Deployment restarted, new pods current", 4*time.Minute, func(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string) {
		if ok, why := complete(si, pods); !ok {
			return false, why
		}
		for i := range pods {
			if old[pods[i].UID] {
				return false, "pod " + pods[i].Name + " is an old one"
			}
		}
		return true, ""
	})
	took := time.Since(relaxed)
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: rolloutNS, Name: rolloutApp}, d); err != nil {
		t.Fatal(err)
	}
	if d.Annotations[v1alpha1.SidecarRestartedForKey] != si.Status.Revision || d.Spec.Template.Annotations[v1alpha1.RestartedAtKey] == "" {
		t.Errorf("Deployment annotations %v, template %v: want %s=%s and %s", d.Annotations, d.Spec.Template.Annotations,
			v1alpha1.SidecarRestartedForKey, si.Status.Revision, v1alpha1.RestartedAtKey)
	}
	for i := range pods {
		c := specContainer(&pods[i], "proxy")
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == rolloutEnv && e.Value == "restart" }) {
			t.Errorf("new pod %s: proxy env %+v lacks %s", pods[i].Name, c.Env, rolloutEnv)
		}
	}
	t.Logf("figure: PDB relaxed to maxUnavailable 1 -> Deployment restarted (restartedAt %s), 2 new pods injected and Ready in %s; %s",
		d.Spec.Template.Annotations[v1alpha1.RestartedAtKey], took.Round(time.Millisecond), fleetLine(si))
	if err := env.Client.Delete(ctx, pdb); err != nil {
		t.Error(err)
	}
}

// waitPDB waits until the disruption controller reports allowed for pdb.
func waitPDB(ctx context.Context, t *testing.T, pdb *policyv1.PodDisruptionBudget, allowed int32) {
	t.Helper()
	if err := cluster.WaitFor(ctx, time.Minute, fmt.Sprintf("PDB %s allows %d", pdb.Name, allowed), func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
			return false, err
		}
		s := pdb.Status
		return s.ObservedGeneration == pdb.Generation && s.ExpectedPods == 2 && s.DisruptionsAllowed == allowed, nil
	}); err != nil {
		t.Fatalf("%v: status %+v", err, pdb.Status)
	}
}

func rolloutBadImage(ctx context.Context, t *testing.T) {
	before := webSnaps(ctx, t)
	// readyTimeoutSeconds 30: should the pull error not be seen, the
	// rollout still stops, and the rest is checked (see below).
	patchSI(ctx, t, `{"spec":{"values":{"proxy":{"image":"`+rolloutProxyBad+`"}},"rollout":{"strategy":"InPlace","maxUnavailable":1,"readyTimeoutSeconds":30}}}`)
	start := time.Now()
	si, _ := waitRollout(ctx, t, "RolloutBlocked True", 3*time.Minute, func(si *v1alpha1.SidecarInjector, pods []corev1.Pod) (bool, string) {
		c := rolloutCond(si)
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == si.Generation, fmt.Sprintf("RolloutBlocked %+v", c)
	})
	c := rolloutCond(si)
	t.Logf("figure: image %s -> RolloutBlocked True %s in %s", rolloutProxyBad, c.Reason, time.Since(start).Round(time.Millisecond))
	if c.Reason != "ImagePull" || !strings.Contains(c.Message, "ErrImagePull") && !strings.Contains(c.Message, "ImagePullBackOff") {
		// The kubelet (v1.37.2, pkg/kubelet/kubelet_pods.go,
		// convertToAPIContainerStatuses) reports no Waiting reason for an
		// init container, native sidecars included, whose last instance
		// exited 0: the proxy stopped by SIGTERM for its new image stays
		// Terminated (Completed, exit 0) while the pull fails; the reason
		// is in the pod's Events only (Failed "Error: ErrImagePull",
		// BackOff "Back-off pulling image").
		t.Errorf("RolloutBlocked %s %q: want reason ImagePull naming ErrImagePull or ImagePullBackOff\n%s", c.Reason, c.Message, describePods(ctx))
	}
	st := si.Status.Rollout
	if st == nil || len(st.Changed) != 1 || st.BlockedGeneration != si.Generation || st.Blocked == "" {
		t.Fatalf("status.rollout %+v: want one pod changed, blocked at generation %d", st, si.Generation)
	}
	_, changed, _ := strings.Cut(st.Changed[0], "/")
	if _, ok := before[changed]; !ok {
		t.Fatalf("status.rollout.changed %v names no pod of %v", st.Changed, before)
	}
	t.Logf("RolloutBlocked True %s: %s; status.rollout.changed %v, blocked at generation %d", c.Reason, c.Message, st.Changed, st.BlockedGeneration)

	// The stop holds: over two of the rollout's steps (each a reconcile
	// of the fleet controller; while blocked they come at least every
	// 5 s, rollout.Recheck) the other pod stays as it was. The steps are
	// counted, not timed: a loaded machine takes longer for two.
	check := func(ctx context.Context) error {
		pods, err := webPods(ctx)
		if err != nil {
			return nil // a failed read proves nothing either way
		}
		for i := range pods {
			p := &pods[i]
			if p.Name == changed {
				if c := specContainer(p, "proxy"); c.Image != rolloutProxyBad {
					return fmt.Errorf("changed pod %s runs proxy image %s", p.Name, c.Image)
				}
				continue
			}
			if s := snap(p); s != before[p.Name] {
				return fmt.Errorf("pod %s touched after the stop: %+v, was %+v", p.Name, s, before[p.Name])
			}
			if _, ok := p.Annotations[v1alpha1.SidecarRolloutKey]; ok {
				return fmt.Errorf("pod %s carries a rollout record after the stop", p.Name)
			}
		}
		return nil
	}
	steps := fleetReconciles(t)
	if _, err := cluster.Poll(ctx, 200*time.Millisecond, 2*time.Minute, "two rollout steps after the stop", func(ctx context.Context) (bool, error) {
		// Counted first: what those steps did is then in the pods read.
		n := fleetReconciles(t) - steps
		if err := check(ctx); err != nil {
			return false, cluster.Permanent(err)
		}
		return n >= 2, nil
	}); err != nil {
		t.Errorf("%v\n%s", err, describePods(ctx))
	}
	t.Logf("the other pod kept proxy %s, its UID and restart counts", before[otherPod(before, changed)].proxyImage)

	// A CR change (the image back to 1.4.3) resumes it: the stopped pod
	// gets the image in place, the other is current again as it is.
	fixed := time.Now()
	patchSI(ctx, t, `{"spec":{"values":{"proxy":{"image":"`+rolloutProxyNew+`"}}}}`)
	si, pods := waitRollout(ctx, t, "rollout resumed after the CR's change", 3*time.Minute, complete)
	for i := range pods {
		p := &pods[i]
		b, s := before[p.Name], snap(p)
		if s.uid != b.uid || s.proxyImage != rolloutProxyNew || s.nginxRest != b.nginxRest {
			t.Errorf("pod %s after the fix: %+v, was %+v", p.Name, s, b)
		}
	}
	t.Logf("figure: image back to %s -> the stopped pod fixed in place, rollout complete in %s; %s",
		rolloutProxyNew, time.Since(fixed).Round(time.Millisecond), fleetLine(si))
}

// fleetReconciles is how many reconciles the operator's fleet controller
// (controllers/fleet.go, "sidecar-fleet"; each runs a rollout step) has
// finished: controller_runtime_reconcile_total from the registry of the
// operator, which runs in this process.
func fleetReconciles(t *testing.T) float64 {
	t.Helper()
	n, err := cluster.ReconcileTotal("sidecar-fleet")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func otherPod(m map[string]podSnap, not string) string {
	for n := range m {
		if n != not {
			return n
		}
	}
	return ""
}

// deleteNamespace deletes a namespace and waits until it is gone (its
// pods stopped by the kubelet).
func deleteNamespace(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := client.IgnoreNotFound(env.Client.Delete(ctx, ns)); err != nil {
		t.Errorf("delete namespace %s: %v", name, err)
		return
	}
	if err := cluster.WaitFor(ctx, 3*time.Minute, "namespace "+name+" gone", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: name}, ns)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		t.Error(err)
	}
}
