package main

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hookwright/hookwright/internal/desired"
)

func TestParseOperatorDeployment(t *testing.T) {
	if got, err := parseOperatorDeployment("hookwright-system/hookwright-controller-manager"); err != nil || got.String() != "hookwright-system/hookwright-controller-manager" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"name-only", "/name", "ns/", "a/b/c"} {
		if _, err := parseOperatorDeployment(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The shell's logic on a fake client (the real API server's answers are
// test/operator's TestServerFailsOpenWhenOperatorGone): nothing while the
// operator is there; once gone, each configuration switched once and
// counted; a Forbidden logged once however many periods; the operator
// back and gone again switches again.
func TestFailOpenWatch(t *testing.T) {
	const mutating = "hookwright-sidecar-mesh"
	fail := admissionregistrationv1.Fail
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "op", Namespace: "hw"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1)}}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: mutating},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "inject.sidecar.hookwright.io", FailurePolicy: &fail}}}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: desired.ValidatingConfigName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: desired.ValidatingWebhookName, FailurePolicy: &fail}}}
	forbidVWC := true
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(dep, mwc, vwc).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok && forbidVWC {
				return apierrors.NewForbidden(schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"}, obj.GetName(), nil)
			}
			return cl.Patch(ctx, obj, patch, opts...)
		}}).Build()
	var logs []string
	log := funcr.New(func(prefix, args string) { logs = append(logs, args) }, funcr.Options{})
	reg := prometheus.NewRegistry()
	w, err := newFailOpenWatch(c, c, "hw/op", mutating, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	policy := func(obj client.Object) admissionregistrationv1.FailurePolicyType {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		switch o := obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			return *o.Webhooks[0].FailurePolicy
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			return *o.Webhooks[0].FailurePolicy
		}
		return ""
	}
	count := func(substr string) int {
		n := 0
		for _, l := range logs {
			n += strings.Count(l, substr)
		}
		return n
	}

	w.check(ctx)
	if policy(mwc) != fail || policy(vwc) != fail || len(logs) != 0 {
		t.Fatalf("operator present: mutating %s validating %s logs %v", policy(mwc), policy(vwc), logs)
	}
	// Scaled to zero: gone.
	dep.Spec.Replicas = ptr.To[int32](0)
	if err := c.Update(ctx, dep); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		w.check(ctx)
	}
	if policy(mwc) != admissionregistrationv1.Ignore || policy(vwc) != fail {
		t.Fatalf("gone: mutating %s validating %s", policy(mwc), policy(vwc))
	}
	if n := count("permission missing"); n != 1 {
		t.Fatalf("Forbidden logged %d times in 3 periods, want 1: %v", n, logs)
	}
	if n := testutil.ToFloat64(w.switched.WithLabelValues(mutating)); n != 1 {
		t.Fatalf("counted %v switches of %s, want 1", n, mutating)
	}
	// Permission granted: the validating one follows; a user's Fail on
	// the mutating one meanwhile is left alone (switched once).
	forbidVWC = false
	mwc.Webhooks[0].FailurePolicy = &fail
	if err := c.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	w.check(ctx)
	if policy(vwc) != admissionregistrationv1.Ignore || policy(mwc) != fail {
		t.Fatalf("after the grant: mutating %s validating %s", policy(mwc), policy(vwc))
	}
	// Back, then deleted: switched again.
	dep.Spec.Replicas = ptr.To[int32](1)
	if err := c.Update(ctx, dep); err != nil {
		t.Fatal(err)
	}
	w.check(ctx)
	if policy(mwc) != fail {
		t.Fatalf("operator back: mutating %s", policy(mwc))
	}
	if err := c.Delete(ctx, dep); err != nil {
		t.Fatal(err)
	}
	w.check(ctx)
	if policy(mwc) != admissionregistrationv1.Ignore {
		t.Fatalf("deleted: mutating %s", policy(mwc))
	}
	if n := count("switched webhooks to failurePolicy Ignore"); n != 3 {
		t.Fatalf("%d switches logged, want 3: %v", n, logs)
	}
	// Its own configuration deleted: nothing to do, no error.
	if err := c.Delete(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	before := len(logs)
	w.done = map[string]bool{}
	w.check(ctx)
	if len(logs) != before {
		t.Fatalf("configuration absent: logged %v", logs[before:])
	}
}
