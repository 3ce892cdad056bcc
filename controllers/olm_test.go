package controllers

import (
	"context"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	apiv2 "github.com/operator-framework/api/pkg/operators/v2"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hookwright/hookwright/internal/desired"
)

func TestUpgradeGateWithoutOLM(t *testing.T) {
	t.Setenv(OperatorConditionEnv, "")
	g := newUpgradeGate(nil, "hookwright-system", logr.Discard())
	if g.Enabled() {
		t.Fatal("enabled without " + OperatorConditionEnv)
	}
	if err := g.Hold(context.Background(), caRotationHold, "x"); err != nil {
		t.Fatal(err)
	}
	var nilGate *upgradeGate
	if nilGate.Enabled() || nilGate.Hold(context.Background(), "k", "x") != nil || nilGate.Release(context.Background(), "k") != nil {
		t.Fatal("a nil gate does something")
	}
}

// The gate writes the OperatorCondition only when Upgradeable changes.
func TestUpgradeGateWritesOnChange(t *testing.T) {
	t.Setenv(OperatorConditionEnv, "hookwright.v1.0.0")
	s := runtime.NewScheme()
	if err := apiv2.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	oc := &apiv2.OperatorCondition{ObjectMeta: metav1.ObjectMeta{Name: "hookwright.v1.0.0", Namespace: "ns"}}
	updates := 0
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(oc).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			updates++
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	g := newUpgradeGate(c, "ns", logr.Discard())
	ctx := context.Background()
	status := func() (metav1.ConditionStatus, string) {
		t.Helper()
		got := &apiv2.OperatorCondition{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(oc), got); err != nil {
			t.Fatal(err)
		}
		cond := apimeta.FindStatusCondition(got.Spec.Conditions, apiv2.Upgradeable)
		if cond == nil {
			return "", ""
		}
		return cond.Status, cond.Message
	}
	steps := []struct {
		do      func() error
		want    metav1.ConditionStatus
		updates int
	}{
		{func() error { return g.Release(ctx, caRotationHold) }, metav1.ConditionTrue, 1},
		{func() error { return g.Hold(ctx, caRotationHold, "CA rotation") }, metav1.ConditionFalse, 2},
		{func() error { return g.Hold(ctx, caRotationHold, "CA rotation") }, metav1.ConditionFalse, 2},
		{func() error { return g.Hold(ctx, restoreHold("pool"), "NodeOversell pool restoring its nodes") }, metav1.ConditionFalse, 3},
		{func() error { return g.Release(ctx, caRotationHold) }, metav1.ConditionFalse, 4},
		{func() error { return g.Release(ctx, restoreHold("pool")) }, metav1.ConditionTrue, 5},
		{func() error { return g.Release(ctx, restoreHold("pool")) }, metav1.ConditionTrue, 5},
	}
	for i, st := range steps {
		if err := st.do(); err != nil {
			t.Fatal(err)
		}
		if got, msg := status(); got != st.want || updates != st.updates {
			t.Fatalf("step %d: Upgradeable=%s (%q) after %d updates, want %s after %d", i, got, msg, updates, st.want, st.updates)
		}
	}
}

func TestProxyEnvReachesServers(t *testing.T) {
	s := testSettings
	s.ProxyEnv = []corev1.EnvVar{{Name: "HTTPS_PROXY", Value: "http://proxy:3128"}, {Name: "https_proxy", Value: "http://proxy:3128"}}
	d := desired.BuildNodeOversell(testOversell(), s.Settings)
	env := d.Deployment.Spec.Template.Spec.Containers[0].Env
	if !slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == "HTTPS_PROXY" && e.Value == "http://proxy:3128" }) ||
		!slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAMESPACE" }) {
		t.Fatalf("env %+v", env)
	}
}
