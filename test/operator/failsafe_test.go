package operator

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// waitPolicy waits until si's FailurePolicyEnforced has status st and one
// of reasons, and its configuration carries fp; it returns the condition.
func waitPolicy(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector, st metav1.ConditionStatus, fp admissionregistrationv1.FailurePolicyType, reasons ...string) metav1.Condition {
	t.Helper()
	var last *metav1.Condition
	var published admissionregistrationv1.FailurePolicyType
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	err := cluster.WaitFor(ctx, bound(3*time.Minute), "failurePolicy "+string(fp), func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		last = apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionFailurePolicyEnforced)
		if err := env.Client.Get(ctx, client.ObjectKey{Name: desired.SidecarKind.BaseName(si.Name)}, mwc); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		published = ""
		for _, w := range mwc.Webhooks {
			if w.FailurePolicy == nil || (published != "" && *w.FailurePolicy != published) {
				return false, nil
			}
			published = *w.FailurePolicy
		}
		return last != nil && last.Status == st && published == fp && reasonIn(last.Reason, reasons), nil
	})
	if err != nil {
		t.Fatalf("%v; published %q, condition %+v; conditions: %s", err, published, last, fmtConds(si.Status.Conditions))
	}
	return *last
}

// armFail serves si's webhook with a local server routed behind its
// Service and waits until Fail is in effect; it returns the owned objects
// and the server.
func armFail(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector, name string) (owned, *localServer) {
	t.Helper()
	o := ownedKeys(desired.SidecarKind.BaseName(si.Name), operatorNS)
	o.fetch(t, ctx, "SidecarInjector", si.UID)
	srv := serveInjector(t, o, name)
	waitPolicy(t, ctx, si, metav1.ConditionTrue, admissionregistrationv1.Fail, v1alpha1.FailurePolicyReasonAsRequested)
	return o, srv
}

// serveInjector starts the injector of o with the operator's certificate
// and RBAC and routes o's Service to it until the test ends.
func serveInjector(t *testing.T, o owned, name string) *localServer {
	t.Helper()
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, o.SA.Name)
	srv := startLocalServer(t, name, o.Deploy.Spec.Template.Spec.Containers[0].Args,
		o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	srv.follow(t, o.Secret)
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(o.Svc) })
	return srv
}

// A SidecarInjector asking for Fail whose server cannot be scheduled (a CPU
// request no node has) is published with Ignore: pods in its scope are
// created, and the CR says why. Once the request fits and the server
// answers the probe, the configuration becomes Fail.
func TestFailOnlyOnceReachable(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 4*time.Minute)
	c := env.Client
	si := scopedInjector(t, "unready", "failsafe-test", "on", v1alpha1.FailurePolicyFail)
	si.Spec.Server.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1000")}}
	create(t, ctx, si)
	const ns = "failsafe-apps"
	if _, err := env.CreateNamespace(ctx, ns, map[string]string{"failsafe-test": "on"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})

	cond := waitPolicy(t, ctx, si, metav1.ConditionFalse, admissionregistrationv1.Ignore, v1alpha1.FailurePolicyReasonServerUnavailable)
	t.Logf("unschedulable server: FailurePolicyEnforced False %s: %s", cond.Reason, cond.Message)
	if a := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionServerAvailable); a == nil || a.Status != metav1.ConditionFalse {
		t.Fatalf("ServerAvailable %+v, want False", a)
	}
	// Pods in scope are created (uninjected) while the server cannot run.
	created := 0
	for range 5 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatalf("pod in scope refused while the server cannot start: %v", err)
		}
		created++
	}
	t.Logf("%d pods in scope created while the server was unschedulable", created)

	// Fixed: the request fits a node; the server answers through the Service.
	if err := update(ctx, si, func() { si.Spec.Server.Resources = nil }); err != nil {
		t.Fatal(err)
	}
	o := ownedKeys(desired.SidecarKind.BaseName(si.Name), operatorNS)
	o.fetch(t, ctx, "SidecarInjector", si.UID)
	srv := serveInjector(t, o, "injector-unready")
	t0 := time.Now()
	cond = waitPolicy(t, ctx, si, metav1.ConditionTrue, admissionregistrationv1.Fail, v1alpha1.FailurePolicyReasonAsRequested)
	t.Logf("fixed: Fail %s after the server was routed: %s", time.Since(t0).Round(time.Millisecond), cond.Message)

	// whenUnreachable Fail (the default) keeps Fail when the server goes.
	env.UnrouteService(o.Svc)
	if err := srv.proc.Stop(5 * time.Second); err != nil {
		t.Logf("stop: %v", err)
	}
	waitReachable(t, ctx, si, metav1.ConditionFalse, nil, 3*time.Minute)
	cond = waitPolicy(t, ctx, si, metav1.ConditionTrue, admissionregistrationv1.Fail, v1alpha1.FailurePolicyReasonKeptUnreachable)
	t.Logf("server gone, whenUnreachable Fail: %s", cond.Message)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
	if err := c.Create(ctx, p, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Fatalf("ordinary pod in scope with Fail kept and no server: %v, want refused", err)
	}
	// whenUnreachable Ignore falls back.
	if err := update(ctx, si, func() { si.Spec.WhenUnreachable = v1alpha1.FailurePolicyIgnore }); err != nil {
		t.Fatal(err)
	}
	cond = waitPolicy(t, ctx, si, metav1.ConditionFalse, admissionregistrationv1.Ignore, v1alpha1.FailurePolicyReasonFellBack)
	t.Logf("server gone, whenUnreachable Ignore: %s", cond.Message)
	if err := c.Create(ctx, p, client.DryRunAll); err != nil {
		t.Fatalf("pod in scope after falling back to Ignore: %v", err)
	}
}

// With the injector down and Fail in effect, what the cluster needs to
// recover is still admitted: pods of the two critical priority classes
// (a CNI-like daemon), a mirror pod created with the node's identity, and
// any pod in a namespace of --excluded-namespaces; an ordinary pod in
// scope is refused.
func TestRecoveryPodsAdmittedWhileDown(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	c := env.Client
	sel := map[string]string{"failsafe-recovery": "on"}
	si := cluster.SampleInjector(t, "recovery")
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: sel}
	si.Spec.FailurePolicy = v1alpha1.FailurePolicyFail
	create(t, ctx, si)
	const ns = "recovery-apps"
	for _, n := range []string{ns, excludedNS} {
		if _, err := env.CreateNamespace(ctx, n, sel); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
		})
	}
	waitConfigured(t, ctx, si, 60*time.Second)
	o, srv := armFail(t, ctx, si, "injector-recovery")
	env.UnrouteService(o.Svc)
	if err := srv.proc.Stop(5 * time.Second); err != nil {
		t.Logf("stop: %v", err)
	}
	pod := func(ns string, mutate func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "p-", Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
		if mutate != nil {
			mutate(p)
		}
		return p
	}
	var refused error
	err := cluster.WaitFor(ctx, 60*time.Second, "an ordinary pod refused while the injector is down", func(ctx context.Context) (bool, error) {
		refused = c.Create(ctx, pod(ns, nil), client.DryRunAll)
		return refused != nil && strings.Contains(refused.Error(), "failed calling webhook"), nil
	})
	if err != nil {
		t.Fatalf("%v; last: %v", err, refused)
	}
	t.Logf("ordinary pod in scope refused: %v", refused)

	admitted := 0
	for _, pc := range []string{"system-node-critical", "system-cluster-critical"} {
		if err := c.Create(ctx, pod(ns, func(p *corev1.Pod) { p.Spec.PriorityClassName = pc }), client.DryRunAll); err != nil {
			t.Errorf("pod with priorityClassName %s refused while the injector is down: %v", pc, err)
		} else {
			admitted++
		}
	}
	if err := c.Create(ctx, pod(excludedNS, nil), client.DryRunAll); err != nil {
		t.Errorf("pod in excluded namespace %s refused: %v", excludedNS, err)
	} else {
		admitted++
	}
	// A mirror pod, as the kubelet of kwok-node-0 creates it (the node
	// authorizer and NodeRestriction admit only that identity).
	kubelet, err := client.New(env.KubeletConfig("kwok-node-0"), client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "kwok-node-0"}, node); err != nil {
		t.Fatal(err)
	}
	mirror := pod(ns, func(p *corev1.Pod) {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "static-hash"}
		p.Spec.NodeName = node.Name
		// NodeRestriction: a node's mirror pod is owned by its Node.
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptrTo(true)}}
	})
	if err := kubelet.Create(ctx, mirror, client.DryRunAll); err != nil {
		t.Errorf("mirror pod refused while the injector is down: %v", err)
	} else {
		admitted++
	}
	t.Logf("injector down with Fail: %d of 4 recovery pods admitted, the ordinary pod refused", admitted)
}

// selectorWebhookSelector is a NodeOversell's first webhook's
// objectSelector: its nodeSelector, and no node a NodeOversell manages
// (those reach only the held. webhook, one call per heartbeat).
func selectorWebhookSelector(sel *metav1.LabelSelector) *metav1.LabelSelector {
	out := sel.DeepCopy()
	if out == nil {
		out = &metav1.LabelSelector{}
	}
	out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{Key: v1alpha1.OversellNodeLabel, Operator: metav1.LabelSelectorOpDoesNotExist})
	return out
}

// Break-glass with the operator stopped: annotating a CR with the pause
// annotation is admitted though the manager's own validating webhook
// (failurePolicy Fail) cannot answer, since its matchConditions send it
// only creates and spec changes; a webhook configuration an admin then
// deletes stays deleted once the operator is back, while the CR is paused.
func TestBreakGlassWithOperatorStopped(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	si := cluster.SampleInjector(t, "breakglass")
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"breakglass-test": "on"}}
	create(t, ctx, si)
	waitConfigured(t, ctx, si, 60*time.Second)

	stopOperator()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
				t.Errorf("restart the operator: %v", err)
			}
		}
	})
	// A spec change needs the manager's webhook: refused while it is down.
	specErr := update(ctx, si, func() { si.Spec.TimeoutSeconds = ptrTo[int32](7) })
	pauseErr := update(ctx, si, func() {
		if si.Annotations == nil {
			si.Annotations = map[string]string{}
		}
		si.Annotations[controllers.PauseReconcileAnnotation] = "true"
	})
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: desired.SidecarKind.BaseName(si.Name)}}
	delErr := c.Delete(ctx, mwc)
	restarted = true
	if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
		t.Fatal(err)
	}
	if pauseErr != nil {
		t.Fatalf("pause annotation refused with the operator stopped: %v", pauseErr)
	}
	if delErr != nil {
		t.Fatalf("delete the configuration: %v", delErr)
	}
	if specErr == nil || !strings.Contains(specErr.Error(), "failed calling webhook") {
		t.Errorf("spec change with the operator stopped: %v, want refused by the unreachable validating webhook", specErr)
	}
	t.Logf("operator stopped: pause annotation admitted, spec change refused: %v", specErr)

	// The restarted operator sees the pause and leaves the deletion alone.
	err := cluster.WaitFor(ctx, 60*time.Second, "Ready False ReconcilePaused", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		r := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionReady)
		return r != nil && r.Reason == controllers.ReasonPaused, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, ctx)
	if err := c.Get(ctx, client.ObjectKeyFromObject(mwc), mwc); !apierrors.IsNotFound(err) {
		t.Fatalf("configuration deleted while paused: get says %v, want NotFound", err)
	}
	// Unpaused, the operator puts it back.
	if err := update(ctx, si, func() { delete(si.Annotations, controllers.PauseReconcileAnnotation) }); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitFor(ctx, 60*time.Second, "configuration back", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(mwc), mwc)
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// The availability settings of a server reach its pods through the real
// API server: spec.server.priorityClassName is rendered into the
// Deployment's pod template and the Priority admission plugin resolves it
// into each pod's spec.priority when kube-controller-manager's ReplicaSet
// creates the pod; the default topology spread (hostname and zone,
// ScheduleAnyway) is in the template and the pods still schedule on the
// harness's kwok nodes. The CRD's CEL rule refuses a reserved "system-"
// name, and a critical class is admitted with the ResourceQuota warning.
func TestServerPriorityClassAndSpread(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	const pcName, pcValue = "hookwright-test-servers", int32(100000)
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: pcName}, Value: pcValue,
		Description: "test/operator TestServerPriorityClassAndSpread"}
	create(t, ctx, pc)

	// The CRD's own validation, and the validating webhook's warning.
	bad := cluster.SampleInjector(t, "prio-reserved")
	bad.Spec.Server.PriorityClassName = "system-high"
	if err := c.Create(ctx, bad, client.DryRunAll); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("priorityClassName system-high: %v, want Invalid (reserved prefix)", err)
	}
	wc, warns := env.WarningsClient(t)
	critical := cluster.SampleInjector(t, "prio-critical")
	critical.Spec.Server.PriorityClassName = v1alpha1.PriorityClusterCritical
	var got []string
	err := cluster.WaitFor(ctx, 60*time.Second, "the critical class warning", func(ctx context.Context) (bool, error) {
		warns.Take()
		if err := wc.Create(ctx, critical.DeepCopy(), client.DryRunAll); err != nil {
			return false, err
		}
		got = warns.Take()
		return slices.ContainsFunc(got, func(w string) bool {
			return strings.Contains(w, "namespace "+operatorNS+" needs a ResourceQuota with scopeSelector PriorityClass In [system-cluster-critical]")
		}), nil
	})
	if err != nil {
		t.Fatalf("%v; warnings %q", err, got)
	}
	t.Logf("critical class warning: %q", got)

	si := cluster.SampleInjector(t, "prio")
	si.Spec.Server.PriorityClassName = pcName
	create(t, ctx, si)
	op := desired.SidecarCR(si)
	o := ownedKeys(desired.SidecarKind.BaseName(si.Name), operatorNS)
	err = cluster.WaitFor(ctx, 60*time.Second, "the server Deployment", func(ctx context.Context) (bool, error) {
		return client.IgnoreNotFound(c.Get(ctx, client.ObjectKeyFromObject(o.Deploy), o.Deploy)) == nil && o.Deploy.UID != "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ps := o.Deploy.Spec.Template.Spec
	if ps.PriorityClassName != pcName {
		t.Fatalf("pod template priorityClassName %q, want %q", ps.PriorityClassName, pcName)
	}
	keys := map[string]corev1.UnsatisfiableConstraintAction{}
	for _, tsc := range ps.TopologySpreadConstraints {
		keys[tsc.TopologyKey] = tsc.WhenUnsatisfiable
		if tsc.MaxSkew != 1 || tsc.LabelSelector == nil || !reflect.DeepEqual(tsc.LabelSelector.MatchLabels, desired.SelectorLabels(op)) {
			t.Errorf("spread %+v: want maxSkew 1 over the server's own pods", tsc)
		}
	}
	if want := map[string]corev1.UnsatisfiableConstraintAction{corev1.LabelHostname: corev1.ScheduleAnyway, corev1.LabelTopologyZone: corev1.ScheduleAnyway}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("topology spread %v, want %v", keys, want)
	}

	// kube-controller-manager creates the pods; Priority admission
	// resolves the class; the scheduler places them despite the spread.
	var pods []corev1.Pod
	err = cluster.WaitFor(ctx, 90*time.Second, "2 scheduled server pods", func(ctx context.Context) (bool, error) {
		var list corev1.PodList
		if err := c.List(ctx, &list, client.InNamespace(operatorNS), client.MatchingLabels(desired.SelectorLabels(op))); err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
				pods = append(pods, p)
			}
		}
		return len(pods) == 2, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Spec.PriorityClassName != pcName || p.Spec.Priority == nil || *p.Spec.Priority != pcValue {
			t.Errorf("pod %s: priorityClassName %q priority %v, want %q resolved to %d", p.Name, p.Spec.PriorityClassName, p.Spec.Priority, pcName, pcValue)
		} else {
			t.Logf("pod %s on %s: priorityClassName %s, spec.priority %d (set by the API server)", p.Name, p.Spec.NodeName, p.Spec.PriorityClassName, *p.Spec.Priority)
		}
	}

}

// Clearing spec.server.priorityClassName takes it off the server
// Deployment's pod template: the operator's field manager owns the field
// in managedFields and the desired object no longer has it, which is drift
// (apply.Released), so the operator applies and the API server removes
// it. Afterwards neither a restarted operator's reconciles nor one queued
// by a label another manager puts on the Deployment write the Deployment
// (counted as the operator's write requests to the Deployment's path).
func TestServerPriorityClassCleared(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	const pcName = "hookwright-test-cleared"
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: pcName}, Value: 1000,
		Description: "test/operator TestServerPriorityClassCleared"}
	create(t, ctx, pc)

	si := cluster.SampleInjector(t, "prio-cleared")
	si.Spec.Server.PriorityClassName = pcName
	create(t, ctx, si)
	o := ownedKeys(desired.SidecarKind.BaseName(si.Name), operatorNS)
	deploy := o.Deploy
	templateClass := func(want string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return deploy.Spec.Template.Spec.PriorityClassName == want, nil
		}
	}
	if err := cluster.WaitFor(ctx, 60*time.Second, "priorityClassName on the pod template", templateClass(pcName)); err != nil {
		t.Fatal(err)
	}

	deployPath := fmt.Sprintf("/apis/apps/v1/namespaces/%s/deployments/%s", deploy.Namespace, deploy.Name)
	settle(t, ctx)
	beforeClear := writes.Of(deployPath)
	if err := update(ctx, si, func() { si.Spec.Server.PriorityClassName = "" }); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitFor(ctx, 60*time.Second, "priorityClassName gone from the pod template", templateClass("")); err != nil {
		t.Fatal(err)
	}
	for _, m := range deploy.ManagedFields {
		if m.FieldsV1 != nil && strings.Contains(string(m.FieldsV1.Raw), `"f:priorityClassName"`) {
			t.Errorf("%s (%s) still owns priorityClassName", m.Manager, m.Operation)
		}
	}
	settle(t, ctx)
	t.Logf("operator writes to the Deployment for the cleared class: %d", writes.Of(deployPath)-beforeClear)

	// A restarted operator (nothing remembered of its applies) reconciles
	// every CR, and another manager's label queues one more reconcile.
	before := writes.Of(deployPath)
	restartOperator(t, env.Config, allowedServerNamespaces)
	settle(t, ctx)
	reconciled, err := cluster.ReconcileTotal(desired.SidecarKind.Short)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(deploy.DeepCopy())
	deploy.Labels["test.hookwright.io/touched"] = "yes"
	if err := c.Patch(ctx, deploy, patch, client.FieldOwner("test-label")); err != nil {
		t.Fatal(err)
	}
	err = cluster.WaitFor(ctx, 60*time.Second, "a SidecarInjector reconcile after the label", func(context.Context) (bool, error) {
		n, err := cluster.ReconcileTotal(desired.SidecarKind.Short)
		return n > reconciled, err
	})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, ctx)
	if err := c.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err != nil {
		t.Fatal(err)
	}
	if n := writes.Of(deployPath) - before; n != 0 {
		t.Fatalf("operator wrote the Deployment %d times after the cleared class was applied (across a restart); recent writes: %v", n, writes.Recent())
	}
	if deploy.Spec.Template.Spec.PriorityClassName != "" || deploy.Labels["test.hookwright.io/touched"] != "yes" {
		t.Fatalf("priorityClassName %q, labels %v", deploy.Spec.Template.Spec.PriorityClassName, deploy.Labels)
	}
}
