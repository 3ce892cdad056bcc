package operator

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/serverpolicy"
	"github.com/hookwright/hookwright/test/cluster"
)

// No confused deputy, through the real API server: a CR naming a server
// namespace, image or Secret the operator's flags do not allow is denied
// by the validating webhook (403, naming the field and the flag); one that
// got in anyway (webhook bypassed: admitted before it existed, or while it
// was down) is refused by the reconciler, which creates nothing for it,
// says why in Ready, and takes the webhooks out of a configuration it had
// written, until the CR is allowed again.
func TestServerPolicy(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	c := env.Client

	// The webhook: retried while it comes up (the first test may be this one).
	forbidden := func(obj client.Object, wants ...string) {
		t.Helper()
		var err error
		werr := cluster.WaitFor(ctx, 60*time.Second, "denied by the webhook", func(ctx context.Context) (bool, error) {
			err = c.Create(ctx, obj.DeepCopyObject().(client.Object), client.DryRunAll)
			return err != nil && strings.Contains(err.Error(), "denied the request"), nil
		})
		if werr != nil {
			t.Fatalf("%v: last create: %v", werr, err)
		}
		if !apierrors.IsForbidden(err) {
			t.Errorf("denial is not Forbidden: %v", err)
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("denial %q does not mention %q", err, w)
			}
		}
		t.Logf("denied: %v", err)
	}
	si := cluster.SampleInjector(t, "deputy-ns")
	si.Spec.Server.Namespace = "kube-system"
	forbidden(si, "spec.server.namespace", `"kube-system"`, serverpolicy.NamespacesFlag)
	si = cluster.SampleInjector(t, "deputy-image")
	si.Spec.Server.Image = "evil.example/miner:latest"
	forbidden(si, "spec.server.image", serverpolicy.ImagesFlag)
	no := &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "deputy-secret"}, Spec: v1alpha1.NodeOversellSpec{
		Ratios:      v1alpha1.OversellRatios{CPU: "2"},
		Certificate: v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: desired.CASecretName},
	}}
	forbidden(no, "spec.certificate.secretName", desired.CASecretName)
	// Allowed: the second allowed namespace and an allowed image prefix.
	ok := cluster.SampleInjector(t, "deputy-allowed")
	ok.Spec.Server.Namespace = serverNS
	ok.Spec.Server.Image = "registry.example.com/allowed/injector:v2"
	if err := c.Create(ctx, ok, client.DryRunAll); err != nil {
		t.Fatalf("allowed injector denied: %v", err)
	}

	// The reconciler: a CR admitted with the webhook bypassed.
	bypass := func(f func()) {
		webhookBypass.Store(true)
		defer webhookBypass.Store(false)
		f()
	}
	sneaky := cluster.SampleInjector(t, "deputy-sneaky")
	sneaky.Spec.Server.Namespace = "kube-system"
	bypass(func() {
		if err := c.Create(ctx, sneaky); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { _ = c.Delete(context.Background(), sneaky) })
	refused := func(obj client.Object, conds func() []metav1.Condition, field string) {
		t.Helper()
		waitConditions(t, ctx, obj, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionReady: metav1.ConditionFalse}, 30*time.Second)
		r := apimeta.FindStatusCondition(conds(), v1alpha1.ConditionReady)
		if r.Reason != controllers.ReasonServerNotAllowed || !strings.Contains(r.Message, field) || !strings.Contains(r.Message, "--allowed-server-") {
			t.Fatalf("Ready: %s: %s, want %s naming %s and the flag", r.Reason, r.Message, controllers.ReasonServerNotAllowed, field)
		}
		t.Logf("refused: %s", r.Message)
	}
	refused(sneaky, func() []metav1.Condition { return sneaky.Status.Conditions }, "spec.server.namespace")
	// The refusal comes before any write of this reconcile: nothing exists.
	base := desired.SidecarKind.BaseName(sneaky.Name)
	for _, obj := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: base, Namespace: "kube-system"}},
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: base}},
	} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
			t.Fatalf("%T %s of a refused CR: %v", obj, obj.GetName(), err)
		}
	}

	// An allowed CR turned into a forbidden one: its webhooks are removed
	// (the API server stops calling a server the operator does not vouch
	// for) and its Deployment keeps the allowed image; allowed again, all
	// is back.
	turned := cluster.SampleInjector(t, "deputy-turned")
	if err := c.Create(ctx, turned); err != nil {
		t.Fatal(err)
	}
	o := ownedKeys(desired.SidecarKind.BaseName(turned.Name), operatorNS)
	defer deleteAndWait(t, ctx, turned, o)
	conds := func() []metav1.Condition { return turned.Status.Conditions }
	waitConditions(t, ctx, turned, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue}, 60*time.Second)
	bypass(func() {
		if err := update(ctx, turned, func() { turned.Spec.Server.Image = "evil.example/miner:latest" }); err != nil {
			t.Fatal(err)
		}
	})
	refused(turned, conds, "spec.server.image")
	mwc := o.MWC.DeepCopy()
	if err := c.Get(ctx, client.ObjectKeyFromObject(mwc), mwc); err != nil || len(mwc.Webhooks) != 0 {
		t.Fatalf("webhook configuration of a refused CR: err %v, %d webhooks", err, len(mwc.Webhooks))
	}
	dep := o.Deploy.DeepCopy()
	if err := c.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil || dep.Spec.Template.Spec.Containers[0].Image != serverImage {
		t.Fatalf("Deployment of a refused CR: err %v, image %s", err, dep.Spec.Template.Spec.Containers[0].Image)
	}
	if err := update(ctx, turned, func() { turned.Spec.Server.Image = "" }); err != nil {
		t.Fatal(err)
	}
	waitConditions(t, ctx, turned, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue}, 60*time.Second)
	if err := c.Get(ctx, client.ObjectKeyFromObject(mwc), mwc); err != nil || len(mwc.Webhooks) != 1 {
		t.Fatalf("webhook configuration once allowed again: err %v, %d webhooks", err, len(mwc.Webhooks))
	}
}

// A pod that copies a server's labels joins its Service (the API server
// would send it admission reviews): EndpointsOwned turns False naming it,
// with a Warning Event, and True again once it is gone.
func TestForeignEndpointsReported(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	si := cluster.SampleInjector(t, "deputy-copied")
	if err := c.Create(ctx, si); err != nil {
		t.Fatal(err)
	}
	base := desired.SidecarKind.BaseName(si.Name)
	defer deleteAndWait(t, ctx, si, ownedKeys(base, operatorNS))
	conds := func() []metav1.Condition { return si.Status.Conditions }
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionServerAvailable: metav1.ConditionTrue, v1alpha1.ConditionEndpointsOwned: metav1.ConditionTrue,
	}, 90*time.Second)

	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: base}, dep); err != nil {
		t.Fatal(err)
	}
	copied := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "copied-server", Namespace: operatorNS, Labels: dep.Spec.Template.Labels},
		// On a kwok node, which gives it an IP (the scheduler might pick
		// a node another test left without kwok).
		Spec: corev1.PodSpec{NodeName: "kwok-node-0", Containers: []corev1.Container{{Name: "server", Image: "evil.example/listener:1"}}},
	}
	if err := c.Create(ctx, copied); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Delete(context.Background(), copied, client.GracePeriodSeconds(0)) }()
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionEndpointsOwned: metav1.ConditionFalse}, 90*time.Second)
	cond := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionEndpointsOwned)
	if cond.Reason != controllers.ReasonForeignEndpoints || !strings.Contains(cond.Message, operatorNS+"/copied-server") {
		t.Fatalf("EndpointsOwned: %s: %s", cond.Reason, cond.Message)
	}
	t.Logf("reported: %s", cond.Message)
	if err := c.Delete(ctx, copied, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionEndpointsOwned: metav1.ConditionTrue}, 90*time.Second)
	err := cluster.WaitFor(ctx, 30*time.Second, "a "+controllers.ReasonForeignEndpoints+" Warning Event", func(ctx context.Context) (bool, error) {
		reasons, err := eventReasons(ctx, "SidecarInjector", si.Name)
		return reasons[controllers.ReasonForeignEndpoints] > 0, err
	})
	if err != nil {
		t.Fatal(err)
	}
}
