package operator

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// The kustomize uninstall with CRs kept: the manager's Deployment (the one
// OPERATOR_DEPLOYMENT names) is deleted, the kubelet stops its pod, and
// the exiting manager switches every webhook configuration it manages to
// Ignore as soon as it sees its Deployment go, before the pod is stopped.
// `hookwright manager` runs as its own process standing for that pod, with
// a Deployment of its own in a namespace of its own; the test sends SIGTERM
// afterwards, as the kubelet would (kwok runs no process). Then, with no
// operator and no injector running, a pod in the Fail injector's scope and
// a CR spec change are admitted.
//
// The CRs are paused first so that the stand-in manager, whose namespace
// and certificate policy differ from the in-process operator's, changes
// nothing they own: the exit path reads no CR.
func TestUninstallByDeletingOperatorDeployment(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	const (
		ns     = "hookwright-uninstall" // the stand-in manager's namespace
		deploy = "hookwright-controller-manager"
		appsNS = "uninstall-apps"
	)
	si := scopedInjector(t, "uninstall-keep", "uninstall-test", "on", v1alpha1.FailurePolicyFail)
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "uninstall-keep"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "uninstall-none"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		},
	}
	for _, cr := range []client.Object{si, no} {
		create(t, ctx, cr)
	}
	if _, err := env.CreateNamespace(ctx, appsNS, map[string]string{"uninstall-test": "on"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appsNS}})
	})
	waitConfigured(t, ctx, si, 60*time.Second)
	o, srv := armFail(t, ctx, si, "injector-uninstall")
	if err := cluster.WaitFor(ctx, time.Minute, "NodeOversell configuration", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: desired.OversellKind.BaseName(no.Name)}, &admissionregistrationv1.MutatingWebhookConfiguration{})
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	closed, err := cluster.FailClosed(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before the uninstall, failurePolicy Fail on %v", closed)
	for _, cr := range []client.Object{si, no} {
		if err := update(ctx, cr, func() {
			a := cr.GetAnnotations()
			if a == nil {
				a = map[string]string{}
			}
			a[controllers.PauseReconcileAnnotation] = "true"
			cr.SetAnnotations(a)
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The in-process operator stops for good; it comes back (and puts
	// its validating configuration back to Fail) when the test ends.
	stopOperator()
	t.Cleanup(func() {
		if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
			t.Errorf("restart the default operator: %v", err)
			return
		}
		err := cluster.WaitFor(context.Background(), 2*time.Minute, "validating configuration Fail again", func(ctx context.Context) (bool, error) {
			v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: desired.ValidatingConfigName}, v); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return len(v.Webhooks) > 0 && v.Webhooks[0].FailurePolicy != nil && *v.Webhooks[0].FailurePolicy == admissionregistrationv1.Fail, nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	if _, err := env.CreateNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	labels := map[string]string{"app": "uninstall-test-manager"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: deploy},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: serverImage}}},
			},
		},
	}
	if err := c.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	probe := cluster.MustFreePort(t)
	p, err := cluster.StartProcess("manager-uninstall", t.TempDir(), cluster.MustHookwrightBinary(t), []string{
		"manager", "--namespace=" + ns, "--leader-elect=true", "--server-image=" + serverImage,
		"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
		fmt.Sprintf("--webhook-port=%d", cluster.MustFreePort(t)), "--webhook-service=",
	}, []string{"KUBECONFIG=" + env.Kubeconfig, "OPERATOR_DEPLOYMENT=" + deploy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	if err := cluster.WaitFor(ctx, time.Minute, "stand-in manager ready", p.ProbeOK(probe, "/readyz")); err != nil {
		t.Fatal(err)
	}

	// kubectl delete deployment; the kubelet's SIGTERM comes later.
	start := time.Now()
	if err := c.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitFor(ctx, time.Minute, "operator Deployment gone", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(dep), &appsv1.Deployment{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	// The manager watches its Deployment: the switch comes before the
	// kubelet stops the pod.
	var left []string
	err = cluster.WaitFor(ctx, 60*time.Second, "every hookwright webhook configuration Ignore or gone", func(ctx context.Context) (bool, error) {
		if left, err = cluster.FailClosed(ctx, c); err != nil {
			return false, err
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("%v; still Fail: %v\nmanager log:\n%s", err, left, p.Tail(4000))
	}
	switched := time.Since(start)
	if err := p.Stop(45 * time.Second); err != nil {
		t.Fatal(err)
	}
	if left, err = cluster.FailClosed(ctx, c); err != nil || len(left) > 0 {
		t.Fatalf("after the manager exited: still Fail %v (%v)", left, err)
	}
	t.Logf("figure: every configuration Ignore %s after the Deployment delete, before SIGTERM; the manager exited %s after the delete",
		switched.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if b, err := os.ReadFile(p.Log); err != nil || !strings.Contains(string(b), "operator uninstalled: switched to failurePolicy Ignore") {
		t.Errorf("the manager's log does not say it switched to Ignore:\n%s", p.Tail(4000))
	}

	// No operator and no injector: the server's certificate would expire
	// unrenewed. Pods in scope and CR spec changes are admitted.
	env.UnrouteService(o.Svc)
	if err := srv.proc.Stop(5 * time.Second); err != nil {
		t.Logf("stop injector: %v", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: appsNS},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
	if err := c.Create(ctx, pod, client.DryRunAll); err != nil {
		t.Fatalf("pod in scope refused with the operator uninstalled: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
		t.Fatal(err)
	}
	si.Spec.TimeoutSeconds = ptr.To[int32](3)
	if err := c.Update(ctx, si, client.DryRunAll); err != nil {
		t.Fatalf("SidecarInjector spec change refused with the operator uninstalled: %v", err)
	}
}
