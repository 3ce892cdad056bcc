package operator

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// operatorDeploymentName is the operator Deployment of every install, the
// name the operator's RBAC grants its servers (controllers/lifecycle.go).
const operatorDeploymentName = "hookwright-controller-manager"

// failOpenLine is what the injector logs each time it switches a
// configuration (cmd/failopen.go).
const failOpenLine = "operator gone: switched webhooks to failurePolicy Ignore"

// operatorDeploymentObject stands for the operator's Deployment: its pods
// never schedule (this operator runs in the test process).
func operatorDeploymentObject() *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": "hookwright-failopen-test"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: operatorDeploymentName, Namespace: operatorNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptrTo[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"hookwright.io/no-such-node": "true"},
					Containers:   []corev1.Container{{Name: "manager", Image: serverImage}},
				},
			},
		},
	}
}

// policies is every failurePolicy of the injector's and the manager's
// configurations ("" for a missing one).
func policies(ctx context.Context, mutating string) (mw, vw []admissionregistrationv1.FailurePolicyType, err error) {
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: mutating}, m); err != nil {
		return nil, nil, err
	}
	for _, w := range m.Webhooks {
		mw = append(mw, ptrOr(w.FailurePolicy))
	}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: desired.ValidatingConfigName}, v); err != nil {
		return nil, nil, err
	}
	for _, w := range v.Webhooks {
		vw = append(vw, ptrOr(w.FailurePolicy))
	}
	return mw, vw, nil
}

func ptrOr(p *admissionregistrationv1.FailurePolicyType) admissionregistrationv1.FailurePolicyType {
	if p == nil {
		return ""
	}
	return *p
}

func all(ps []admissionregistrationv1.FailurePolicyType, want admissionregistrationv1.FailurePolicyType) bool {
	return len(ps) > 0 && !slices.ContainsFunc(ps, func(p admissionregistrationv1.FailurePolicyType) bool { return p != want })
}

// Uninstall with a SidecarInjector kept, where the operator's RBAC goes
// with its Deployment (Helm, OLM, kubectl delete -k): the operator cannot
// act, so its injector server, running with the RBAC the operator gave
// it, sees the operator's Deployment gone and switches its own
// configuration and the manager's validating one to Ignore, once. A pod
// in scope and a CR spec change are admitted with nothing serving. When
// the operator is back it re-arms Fail after its probe, and the server
// leaves it alone.
func TestServerFailsOpenWhenOperatorGone(t *testing.T) {
	ctx := cluster.TestContext(t, 5*time.Minute)
	c := env.Client
	dep := operatorDeploymentObject()
	if err := c.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), operatorDeploymentObject()) })
	// The operator renders --operator-deployment; when the test ends the
	// default one (none) runs again.
	stopOperator()
	t.Cleanup(func() {
		stopOperator()
		operator.deployment = ""
		if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
			t.Errorf("restart the default operator: %v", err)
		}
	})
	operator.deployment = operatorDeploymentName
	if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
		t.Fatal(err)
	}

	const ns = "failopen-apps"
	if _, err := env.CreateNamespace(ctx, ns, map[string]string{"failopen-test": "on"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	si := scopedInjector(t, "failopen", "failopen-test", "on", v1alpha1.FailurePolicyFail)
	create(t, ctx, si)
	mutating := desired.SidecarKind.BaseName(si.Name)
	waitConfigured(t, ctx, si, 60*time.Second)
	o, srv := armFail(t, ctx, si, "injector-failopen")
	if args := o.Deploy.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--operator-deployment="+operatorNS+"/"+operatorDeploymentName) {
		t.Fatalf("server args %v lack --operator-deployment", args)
	}
	if mw, vw, err := policies(ctx, mutating); err != nil || !all(mw, admissionregistrationv1.Fail) || !all(vw, admissionregistrationv1.Fail) {
		t.Fatalf("before: mutating %v validating %v (%v), want Fail", mw, vw, err)
	}

	// Uninstall: the operator stops (its RBAC went, it can do nothing) and
	// its Deployment is deleted.
	stopOperator()
	if err := c.Delete(ctx, dep); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var mw, vw []admissionregistrationv1.FailurePolicyType
	if err := cluster.WaitFor(ctx, 2*time.Minute, "both configurations Ignore", func(ctx context.Context) (bool, error) {
		var err error
		mw, vw, err = policies(ctx, mutating)
		return all(mw, admissionregistrationv1.Ignore) && all(vw, admissionregistrationv1.Ignore), err
	}); err != nil {
		t.Fatalf("%v: mutating %v validating %v\nserver log:\n%s", err, mw, vw, srv.proc.Tail(3000))
	}
	t.Logf("operator Deployment deleted: both configurations Ignore after %s", time.Since(deleted).Round(time.Millisecond))

	// Nothing serves: the injector's Service leads nowhere, the manager is stopped.
	env.UnrouteService(o.Svc)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
	if err := c.Create(ctx, p, client.DryRunAll); err != nil {
		t.Fatalf("pod in scope with the operator gone and no server: %v", err)
	}
	if err := update(ctx, si, func() { si.Spec.TimeoutSeconds = ptrTo[int32](7) }); err != nil {
		t.Fatalf("spec change with the operator gone: %v", err)
	}

	// The operator is installed again: it re-arms Fail after its probe and
	// the server, seeing it back, leaves it alone.
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, operatorDeploymentObject()); err != nil {
		t.Fatal(err)
	}
	if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
		t.Fatal(err)
	}
	waitPolicy(t, ctx, si, metav1.ConditionTrue, admissionregistrationv1.Fail, v1alpha1.FailurePolicyReasonAsRequested)
	if err := cluster.WaitFor(ctx, time.Minute, "validating Fail again", func(ctx context.Context) (bool, error) {
		var err error
		mw, vw, err = policies(ctx, mutating)
		return all(vw, admissionregistrationv1.Fail), err
	}); err != nil {
		t.Fatalf("%v: validating %v", err, vw)
	}
	if n := strings.Count(srv.proc.Tail(1<<20), failOpenLine); n != 2 {
		t.Fatalf("server logged %d switches, want 2 (one per configuration)\n%s", n, srv.proc.Tail(3000))
	}
}
