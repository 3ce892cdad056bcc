package scenarios

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// Scenario 8's objects.
const (
	// rolloutBinding binds config/rollout's ClusterRole in the lab namespace.
	rolloutBinding = "hookwright-rollout-demo"
	rolloutRole    = "hookwright-rollout"
	// outageApp is the Deployment created while the injector is down.
	outageApp = "outage"
	// The operator's names (controllers' PauseReconcileAnnotation,
	// ReasonPaused, ReasonRolloutComplete), spelled out: the scenarios
	// reach the operator through the API server only.
	pauseReconcile  = "admission.hookwright.io/pause-reconcile"
	reasonPaused    = "ReconcilePaused"
	reasonCompleted = "Complete"
)

// Rollout is scenario 8 (spec.rollout of the sample SidecarInjector, with
// the rights of config/rollout bound in the lab namespace):
//   - kubectl patch of the proxy image 1.4.2 → 1.4.3 with strategy InPlace:
//     deployment test's pods keep their UIDs, only their proxy restarts
//     (once), and `kubectl get sidecarinjectors` goes from outdated to
//     current;
//   - the injector's server stopped (CR paused, its Deployment scaled to 0,
//     failurePolicy Ignore): a Deployment created then runs without
//     sidecars; once the server is back status.fleet counts it missing,
//     and strategy Restart restarts that Deployment, whose new pod is
//     injected;
//   - then lab is put back as the other scenarios know it: the proxy
//     1.4.2 again (in place, the same pods), failurePolicy Fail, no
//     rollout strategy, the outage Deployment and the rights removed.
func Rollout(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster.Client
	defer e.cleanRollout(context.Background())
	if err := e.checkRolloutCRD(ctx); err != nil {
		return err
	}
	sa, err := e.applyOptIn(ctx, "rollout")
	if err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "-n", LabNamespace, "create", "rolebinding", rolloutBinding,
		"--clusterrole="+rolloutRole, "--serviceaccount="+sa); err != nil {
		return err
	}
	r.check("kubectl apply -k config/rollout; kubectl -n %s create rolebinding %s --clusterrole=%s --serviceaccount=%s",
		LabNamespace, rolloutBinding, rolloutRole, sa)

	si, err := waitSample(ctx, e, "sample injector's pods all current", 2*time.Minute, func(si *v1alpha1.SidecarInjector) (bool, string) {
		f := si.Status.Fleet
		return f != nil && f.CurrentPods >= 2 && f.OutdatedPods == 0 && f.MissingPods == 0, fleetColumns(si)
	})
	if err != nil {
		return err
	}
	before, err := labTestPods(ctx, c)
	if err != nil {
		return err
	}
	if len(before) != 2 {
		return fmt.Errorf("%d pods of deployment test in %s, want 2", len(before), LabNamespace)
	}
	for _, p := range before {
		if p.proxyImage != sampleProxyImage {
			return fmt.Errorf("pod %s runs proxy %s, want %s", p.name, p.proxyImage, sampleProxyImage)
		}
	}

	// 1. In place, 1.4.2 → 1.4.3.
	seen, ready := map[string]time.Time{}, map[string]time.Time{}
	counts := []string{fleetColumns(si)}
	start := time.Now()
	if _, _, err := e.RunKubectl(ctx, nil, "patch", "sidecarinjector", SampleInjectorName, "--type=merge", "-p",
		`{"spec":{"values":{"proxy":{"image":"`+newProxyImage+`"}},"rollout":{"strategy":"InPlace","maxUnavailable":1}}}`); err != nil {
		return err
	}
	var why string
	_, err = cluster.Poll(ctx, 25*time.Millisecond, 3*time.Minute, "in-place rollout to "+newProxyImage, func(ctx context.Context) (bool, error) {
		now := time.Now()
		pods, err := labTestPods(ctx, c)
		if err != nil {
			return false, err
		}
		for _, p := range pods {
			b, ok := before[p.name]
			if !ok {
				return false, cluster.Permanent(fmt.Errorf("new pod %s: the in-place rollout replaced a pod", p.name))
			}
			if p.proxyImage == newProxyImage && seen[p.name].IsZero() {
				seen[p.name] = now
			}
			if !seen[p.name].IsZero() && ready[p.name].IsZero() && p.proxyRestarts > b.proxyRestarts && p.ready == "" {
				ready[p.name] = now
			}
		}
		si := &v1alpha1.SidecarInjector{}
		if err := c.Get(ctx, client.ObjectKey{Name: SampleInjectorName}, si); err != nil {
			return false, err
		}
		if l := fleetColumns(si); len(counts) == 0 || counts[len(counts)-1] != l {
			counts = append(counts, l)
		}
		var done bool
		done, why = rolloutComplete(si)
		return done && len(ready) == len(before), nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, why)
	}
	r.timing("kubectl patch: proxy 1.4.2 → 1.4.3, strategy InPlace, maxUnavailable 1 → both pods of deployment test current and Ready", time.Since(start), 0)
	for _, n := range slices.Sorted(mapKeys(ready)) {
		r.timing(fmt.Sprintf("pod %s: its new proxy image seen → proxy restarted and pod Ready (in place)", n), ready[n].Sub(seen[n]), 0)
	}
	// The kubelet can report the new restart count while the restarted
	// proxy's readiness is still the old container's; its probe then
	// reports not ready until it passes. So readiness is awaited here,
	// and the restart count below still says the proxy restarted once.
	var after map[string]labPod
	if err := cluster.WaitFor(ctx, 2*time.Minute, "both pods Ready after the in-place rollout", func(ctx context.Context) (bool, error) {
		var err error
		if after, err = labTestPods(ctx, c); err != nil {
			return false, err
		}
		for _, a := range after {
			if a.ready != "" {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	for n, b := range before {
		a, ok := after[n]
		switch {
		case !ok || a.uid != b.uid:
			return fmt.Errorf("pod %s replaced by the in-place rollout", n)
		case a.proxyRestarts != b.proxyRestarts+1 || a.nginxRestarts != b.nginxRestarts:
			return fmt.Errorf("pod %s: proxy restartCount %d (was %d), nginx %d (was %d): want proxy +1, nginx unchanged",
				n, a.proxyRestarts, b.proxyRestarts, a.nginxRestarts, b.nginxRestarts)
		case a.proxyImage != newProxyImage || a.ready != "":
			return fmt.Errorf("pod %s: proxy %s, %s", n, a.proxyImage, a.ready)
		}
	}
	r.check("kubectl get sidecarinjectors: %s", strings.Join(counts, " → "))
	r.check("pods %s keep their UIDs; proxy %s, its restartCount +1, nginx's unchanged; both Ready", strings.Join(slices.Sorted(mapKeys(after)), ", "), newProxyImage)

	// 2. A pod created while the injector is down.
	if err := e.injectorOutage(ctx, r); err != nil {
		return err
	}
	outage, err := outagePod(ctx, c)
	if err != nil {
		return err
	}
	si, err = waitSample(ctx, e, "the outage pod counted missing", 2*time.Minute, func(si *v1alpha1.SidecarInjector) (bool, string) {
		f := si.Status.Fleet
		m := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionPodsMissingSidecars)
		return f != nil && f.MissingPods == 1 && m != nil && m.Status == metav1.ConditionTrue && strings.Contains(m.Message, outage.Name), fleetColumns(si)
	})
	if err != nil {
		return err
	}
	skipped := ""
	if st := si.Status.Rollout; st != nil {
		for _, s := range st.Skipped {
			skipped += fmt.Sprintf("; status.rollout.skipped: %d %q %v", s.Count, s.Reason, s.Pods)
		}
	}
	r.check("server back: %s; PodsMissingSidecars names %s/%s (strategy InPlace cannot add containers%s)",
		fleetColumns(si), LabNamespace, outage.Name, skipped)

	// 3. Strategy Restart restarts its Deployment.
	start = time.Now()
	if _, _, err := e.RunKubectl(ctx, nil, "patch", "sidecarinjector", SampleInjectorName, "--type=merge", "-p",
		`{"spec":{"rollout":{"strategy":"Restart"}}}`); err != nil {
		return err
	}
	var fixed *corev1.Pod
	si, err = waitSample(ctx, e, "deployment "+outageApp+" restarted, its pod injected", 3*time.Minute, func(si *v1alpha1.SidecarInjector) (bool, string) {
		if ok, why := rolloutComplete(si); !ok {
			return false, why
		}
		p, err := outagePod(ctx, c)
		if err != nil {
			return false, err.Error()
		}
		if p.UID == outage.UID {
			return false, "the outage pod is still the old one"
		}
		if err := injectedOnce(p); err != nil {
			return false, err.Error()
		}
		if err := labPodReady(p); err != nil {
			return false, err.Error()
		}
		fixed = p
		return true, ""
	})
	if err != nil {
		return err
	}
	r.timing("strategy Restart → deployment "+outageApp+" restarted, its new pod injected and Ready", time.Since(start), 0)
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: LabNamespace, Name: outageApp}, d); err != nil {
		return err
	}
	if d.Annotations[v1alpha1.SidecarRestartedForKey] != si.Status.Revision || d.Spec.Template.Annotations[v1alpha1.RestartedAtKey] == "" {
		return fmt.Errorf("deployment %s: annotations %v, template %v; want %s=%s and %s", outageApp, d.Annotations,
			d.Spec.Template.Annotations, v1alpha1.SidecarRestartedForKey, si.Status.Revision, v1alpha1.RestartedAtKey)
	}
	now, err := labTestPods(ctx, c)
	if err != nil {
		return err
	}
	for n, a := range after {
		if now[n].uid != a.uid {
			return fmt.Errorf("strategy Restart replaced the current pod %s", n)
		}
	}
	r.check("deployment %s restarted (%s=%s, %s=%s): new pod %s injected, %s; deployment test's current pods untouched",
		outageApp, v1alpha1.SidecarRestartedForKey, si.Status.Revision, v1alpha1.RestartedAtKey,
		d.Spec.Template.Annotations[v1alpha1.RestartedAtKey], fixed.Name, fleetColumns(si))

	// 4. Lab as the other scenarios know it.
	if err := e.deleteOutage(ctx); err != nil {
		return err
	}
	start = time.Now()
	if _, _, err := e.RunKubectl(ctx, nil, "patch", "sidecarinjector", SampleInjectorName, "--type=merge", "-p",
		`{"spec":{"failurePolicy":"Fail","values":{"proxy":{"image":"`+sampleProxyImage+`"}},"rollout":{"strategy":"InPlace"}}}`); err != nil {
		return err
	}
	if _, err := waitSample(ctx, e, "proxy back to "+sampleProxyImage+" in place", 3*time.Minute, func(si *v1alpha1.SidecarInjector) (bool, string) {
		if ok, why := rolloutComplete(si); !ok {
			return false, why
		}
		pods, err := labTestPods(ctx, c)
		if err != nil {
			return false, err.Error()
		}
		for n, a := range after {
			p, ok := pods[n]
			if !ok || p.uid != a.uid || p.proxyImage != sampleProxyImage || p.ready != "" {
				return false, fmt.Sprintf("pod %s: %+v", n, p)
			}
		}
		return len(pods) == len(after), ""
	}); err != nil {
		return err
	}
	r.timing("proxy back to 1.4.2 in place (the same pods)", time.Since(start), 0)
	if _, _, err := e.RunKubectl(ctx, nil, "patch", "sidecarinjector", SampleInjectorName, "--type=merge", "-p", `{"spec":{"rollout":null}}`); err != nil {
		return err
	}
	if _, err := waitSample(ctx, e, "no rollout", time.Minute, func(si *v1alpha1.SidecarInjector) (bool, string) {
		return si.Status.ObservedGeneration == si.Generation && si.Status.Rollout == nil &&
			apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionRolloutBlocked) == nil, "status.rollout still set"
	}); err != nil {
		return err
	}
	r.check("lab restored: proxy %s on the same pods, failurePolicy Fail, no rollout strategy (status.rollout gone), deployment %s removed", sampleProxyImage, outageApp)
	return nil
}

// checkRolloutCRD fails early, saying why, when the installed CRD (the
// bundle scenario 7 installed) does not know spec.rollout: the API server
// would prune it silently.
func (e *Env) checkRolloutCRD(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: "sidecarinjectors.admission.hookwright.io"}, crd); err != nil {
		return err
	}
	for _, v := range crd.Spec.Versions {
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		if _, ok := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["rollout"]; ok {
			return nil
		}
	}
	return fmt.Errorf("the installed SidecarInjector CRD (its bundle, labels %v) has no spec.rollout: regenerate bundle/ (make bundle)", crd.Labels)
}

// applyOptIn applies the opt-in RBAC of config/<dir> (kubectl apply -k)
// and returns the running operator's ServiceAccount to bind it to
// (operatorServiceAccount).
func (e *Env) applyOptIn(ctx context.Context, dir string) (string, error) {
	sa, err := e.operatorServiceAccount(ctx)
	if err != nil {
		return "", err
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	_, _, err = e.RunKubectl(ctx, nil, "apply", "-k", filepath.Join(root, "config", dir))
	return sa, err
}

// operatorServiceAccount is namespace:name of the ServiceAccount of the
// running operator, wherever it was installed from (the pod running the
// operator image's manager).
func (e *Env) operatorServiceAccount(ctx context.Context) (string, error) {
	var pods corev1.PodList
	if err := e.Cluster.Client.List(ctx, &pods); err != nil {
		return "", err
	}
	repo, _, _ := strings.Cut(ServerImage, ":")
	for _, p := range pods.Items {
		for _, ct := range p.Spec.Containers {
			// Any version of the operator image (scenario 7 leaves 0.1.1).
			if !strings.HasPrefix(ct.Image, repo+":") {
				continue
			}
			if len(ct.Args) > 0 && ct.Args[0] == "manager" || len(ct.Command) > 1 && ct.Command[1] == "manager" {
				return p.Namespace + ":" + p.Spec.ServiceAccountName, nil
			}
		}
	}
	return "", fmt.Errorf("no pod runs the operator (image %s or another tag of it, manager)", ServerImage)
}

// labPod is what scenario 8 compares of a pod of deployment test.
type labPod struct {
	name, proxyImage string
	uid              types.UID
	proxyRestarts    int32
	nginxRestarts    int32
	// ready is why the pod is not ready ("" when it is).
	ready string
}

func labTestPods(ctx context.Context, c client.Client) (map[string]labPod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(LabNamespace), client.MatchingLabels{"app": "test"}); err != nil {
		return nil, err
	}
	out := map[string]labPod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		lp := labPod{name: p.Name, uid: p.UID}
		for _, ct := range append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
			if ct.Name == "proxy" {
				lp.proxyImage = ct.Image
			}
		}
		for _, s := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			switch s.Name {
			case "proxy":
				lp.proxyRestarts = s.RestartCount
			case "nginx":
				lp.nginxRestarts = s.RestartCount
			}
		}
		if err := labPodReady(p); err != nil {
			lp.ready = err.Error()
		}
		out[p.Name] = lp
	}
	return out, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fleetColumns are `kubectl get sidecarinjectors`' fleet columns.
func fleetColumns(si *v1alpha1.SidecarInjector) string {
	f := si.Status.Fleet
	if f == nil {
		return "no status.fleet"
	}
	return fmt.Sprintf("MATCHED %d CURRENT %d OUTDATED %d MISSING %d", f.MatchedPods, f.CurrentPods, f.OutdatedPods, f.MissingPods)
}

// rolloutComplete: the rollout of the CR's generation reached its
// revision, every pod current, none in flight.
func rolloutComplete(si *v1alpha1.SidecarInjector) (bool, string) {
	c := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionRolloutBlocked)
	f := si.Status.Fleet
	switch {
	case si.Status.ObservedGeneration != si.Generation:
		return false, "generation not observed yet"
	case c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonCompleted || c.ObservedGeneration != si.Generation:
		return false, fmt.Sprintf("RolloutBlocked %+v", c)
	case si.Status.Rollout == nil || si.Status.Rollout.Revision != si.Status.Revision:
		return false, "status.rollout not at status.revision"
	case f == nil || f.OutdatedPods != 0 || f.MissingPods != 0:
		return false, fleetColumns(si)
	}
	return true, ""
}

func waitSample(ctx context.Context, e *Env, what string, d time.Duration, ok func(*v1alpha1.SidecarInjector) (bool, string)) (*v1alpha1.SidecarInjector, error) {
	si := &v1alpha1.SidecarInjector{}
	var why string
	err := cluster.WaitFor(ctx, d, what, func(ctx context.Context) (bool, error) {
		if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Name: SampleInjectorName}, si); err != nil {
			return false, err
		}
		var done bool
		done, why = ok(si)
		return done, nil
	})
	if err != nil {
		var conds []string
		for _, c := range si.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
		return si, fmt.Errorf("%w (%s; status.rollout %+v; %s)", err, why, si.Status.Rollout, strings.Join(conds, "; "))
	}
	return si, nil
}

// injectorOutage stops the sample injector's server (stopInjectorServer),
// creates deployment outage in lab, whose pod is admitted without
// sidecars, and brings the server back.
func (e *Env) injectorOutage(ctx context.Context, r *Result) error {
	c := e.Cluster.Client
	name := desired.SidecarKind.BaseName(SampleInjectorName)
	if err := e.stopInjectorServer(ctx); err != nil {
		return err
	}
	start := time.Now()
	if _, _, err := e.RunKubectl(ctx, nil, "-n", LabNamespace, "create", "deployment", outageApp, "--image="+nginx); err != nil {
		return err
	}
	var p *corev1.Pod
	if err := cluster.WaitFor(ctx, 2*time.Minute, "pod of deployment "+outageApp+" running", func(ctx context.Context) (bool, error) {
		var err error
		p, err = outagePod(ctx, c)
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		return err
	}
	if err := untouched(p); err != nil {
		return err
	}
	r.timing("server stopped: kubectl create deployment "+outageApp+" → its pod Running, without sidecars (failurePolicy Ignore)", time.Since(start), 0)
	start = time.Now()
	if _, _, err := e.RunKubectl(ctx, nil, "annotate", "sidecarinjector", SampleInjectorName, pauseReconcile+"-"); err != nil {
		return err
	}
	if err := e.WaitReady(ctx, 3*time.Minute); err != nil {
		return err
	}
	r.timing("CR unpaused → server repaired, Ready with a ready endpoint", time.Since(start), 0)
	r.check("injector server down (CR paused, deployment %s scaled to 0, failurePolicy Ignore): pod %s/%s admitted without sidecars",
		name, LabNamespace, p.Name)
	return nil
}

// stopInjectorServer stops the sample injector's server and leaves it
// stopped: failurePolicy Ignore, the CR paused so the operator does not
// repair it, its Deployment scaled to 0 and its pods gone. The pods are
// deleted with a 1 s grace, as a crash would end them: scaled down
// alone, a server keeps answering the API server's pooled connections
// until the API server closes them (up to 90 s, --drain-close-wait),
// which is not the outage this checks. Unpausing the
// CR brings the server back (with Ignore until spec.failurePolicy is
// set back).
func (e *Env) stopInjectorServer(ctx context.Context) error {
	c := e.Cluster.Client
	name := desired.SidecarKind.BaseName(SampleInjectorName)
	if _, _, err := e.RunKubectl(ctx, nil, "patch", "sidecarinjector", SampleInjectorName, "--type=merge", "-p", `{"spec":{"failurePolicy":"Ignore"}}`); err != nil {
		return err
	}
	if err := cluster.WaitFor(ctx, time.Minute, "webhook failurePolicy Ignore", func(ctx context.Context) (bool, error) {
		configs, err := ownedConfigs(ctx, e)
		if err != nil {
			return false, err
		}
		for _, m := range configs {
			if m.Name == name && len(m.Webhooks) == 1 && m.Webhooks[0].FailurePolicy != nil && string(*m.Webhooks[0].FailurePolicy) == "Ignore" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "annotate", "sidecarinjector", SampleInjectorName, pauseReconcile+"=true"); err != nil {
		return err
	}
	if _, err := waitSample(ctx, e, "the CR paused", time.Minute, func(si *v1alpha1.SidecarInjector) (bool, string) {
		rc := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionReady)
		return rc != nil && rc.Reason == reasonPaused, fmt.Sprintf("Ready %+v", rc)
	}); err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "-n", OperatorNamespace, "scale", "deployment", name, "--replicas=0"); err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "-n", OperatorNamespace, "delete", "pods", "-l", desired.LabelInstance+"="+name, "--grace-period=1", "--wait=false"); err != nil {
		return err
	}
	return cluster.WaitFor(ctx, 2*time.Minute, "injector server pods gone", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := c.List(ctx, &pods, client.InNamespace(OperatorNamespace), client.MatchingLabels{desired.LabelInstance: name})
		return err == nil && len(pods.Items) == 0, err
	})
}

// outagePod is the one pod of deployment outage not being deleted.
func outagePod(ctx context.Context, c client.Client) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(LabNamespace), client.MatchingLabels{"app": outageApp}); err != nil {
		return nil, err
	}
	var live []*corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			live = append(live, &pods.Items[i])
		}
	}
	if len(live) != 1 {
		return nil, fmt.Errorf("%d pods of deployment %s", len(live), outageApp)
	}
	return live[0], nil
}

func (e *Env) deleteOutage(ctx context.Context) error {
	c := e.Cluster.Client
	err := c.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: LabNamespace, Name: outageApp}},
		client.PropagationPolicy(metav1.DeletePropagationForeground))
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	return cluster.WaitFor(ctx, 2*time.Minute, "deployment "+outageApp+" and its pods gone", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(LabNamespace), client.MatchingLabels{"app": outageApp}); err != nil {
			return false, err
		}
		err := c.Get(ctx, client.ObjectKey{Namespace: LabNamespace, Name: outageApp}, &appsv1.Deployment{})
		return apierrors.IsNotFound(err) && len(pods.Items) == 0, nil
	})
}

// cleanRollout puts back what scenario 8 changed, whatever step it
// stopped at (a no-op after a passing run): the CR unpaused with the
// sample's image and failurePolicy and no rollout, the outage Deployment
// and the rights removed.
func (e *Env) cleanRollout(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	_, _, _ = e.RunKubectl(ctx, nil, "annotate", "sidecarinjector", SampleInjectorName, pauseReconcile+"-")
	_, _, _ = e.RunKubectl(ctx, nil, "patch", "sidecarinjector", SampleInjectorName, "--type=merge", "-p",
		`{"spec":{"failurePolicy":"Fail","values":{"proxy":{"image":"`+sampleProxyImage+`"}},"rollout":null}}`)
	_ = e.deleteOutage(ctx)
	_, _, _ = e.RunKubectl(ctx, nil, "-n", LabNamespace, "delete", "rolebinding", rolloutBinding, "--ignore-not-found")
	_, _, _ = e.RunKubectl(ctx, nil, "delete", "clusterrole", rolloutRole, "--ignore-not-found")
}
