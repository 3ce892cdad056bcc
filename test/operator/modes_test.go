package operator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

func deleteAndWait(t *testing.T, ctx context.Context, obj client.Object, o owned) {
	t.Helper()
	if err := env.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	o.waitGone(t, ctx)
}

// Mode Secret: the user's Secret is mounted and its ca.crt becomes the
// caBundle; nothing is written until it exists and verifies.
func TestUserProvidedSecretMode(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 3*time.Minute)
	si := &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "byo"},
		Spec: v1alpha1.SidecarInjectorSpec{
			// No namespace: as for "fought" (TestConflictingWriterBackoff).
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"byo-test": "never"}},
			Certificate:       v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "byo-serving"},
			Server:            v1alpha1.ServerSpec{Replicas: ptr.To[int32](1)},
		},
	}
	create(t, ctx, si)
	conds := func() []metav1.Condition { return si.Status.Conditions }
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionCertificateReady: metav1.ConditionFalse, v1alpha1.ConditionWebhookConfigured: metav1.ConditionFalse,
	}, 30*time.Second)
	if c := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionCertificateReady); c.Reason != sources.ReasonSecretMissing {
		t.Fatalf("CertificateReady %+v", c)
	}
	base := desired.SidecarKind.BaseName("byo")
	o := ownedKeys(base, operatorNS)
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.Deploy), dep); err != nil {
		t.Fatal(err)
	}
	if v := dep.Spec.Template.Spec.Volumes[0].Secret.SecretName; v != "byo-serving" {
		t.Fatalf("mounted Secret %s", v)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.PDB), &policyv1.PodDisruptionBudget{}); !apierrors.IsNotFound(err) {
		t.Fatalf("replicas 1 has a PDB: %v", err)
	}

	ca, crt, key := cluster.MustServiceCA(t, "byo-ca", operatorNS, base)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "byo-serving", Namespace: operatorNS},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": ca.CertPEM},
	}
	created := time.Now()
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	// The user's Secret is watched (metadata): creating it reconciles the
	// CR without any change of the CR (the resync is 5 min).
	waitConditions(t, ctx, si, conds, configured, 30*time.Second)
	t.Logf("user Secret created → WebhookConfigured in %s", time.Since(created).Round(time.Millisecond))
	o.MWC.Name = base
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.MWC), o.MWC); err != nil {
		t.Fatal(err)
	}
	if string(o.MWC.Webhooks[0].ClientConfig.CABundle) != string(ca.CertPEM) {
		t.Fatal("caBundle is not the user's ca.crt")
	}
	// The user replaces the certificate and its CA: caBundle follows.
	ca2, crt2, key2 := cluster.MustServiceCA(t, "byo-ca-2", operatorNS, base)
	sec.Data = map[string][]byte{corev1.TLSCertKey: crt2, corev1.TLSPrivateKeyKey: key2, "ca.crt": ca2.CertPEM}
	replaced := time.Now()
	if err := env.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	err := cluster.WaitFor(ctx, bound(30*time.Second), "caBundle follows the user's new ca.crt", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.MWC), o.MWC); err != nil {
			return false, err
		}
		return string(o.MWC.Webhooks[0].ClientConfig.CABundle) == string(ca2.CertPEM), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("user Secret replaced → caBundle updated in %s", time.Since(replaced).Round(time.Millisecond))
	// The operator issued no Secret of its own for this CR.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o.Secret), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("operator serving Secret exists in mode Secret: %v", err)
	}
	o.PDB, o.Secret = nil, nil
	if err := env.Client.Delete(ctx, si); err != nil {
		t.Fatal(err)
	}
	gone := owned{SA: o.SA, Role: o.Role, Bind: o.Bind, Deploy: o.Deploy, Svc: o.Svc, MWC: o.MWC}
	gone.PDB = &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: base + "-none", Namespace: operatorNS}}
	gone.Secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: base + "-none", Namespace: operatorNS}}
	gone.waitGone(t, ctx)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sec), sec); err != nil {
		t.Fatalf("the user's Secret must survive the CR: %v", err)
	}
}

// A serving certificate past 2/3 of its lifetime is renewed as soon as the
// operator sees it; moving the server to another namespace moves every
// namespaced object, re-issues the certificate for the new SANs and removes
// the old objects; replicas 1 removes the PDB.
func TestRenewalAndNamespaceMove(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "movable"}}
	create(t, ctx, si)
	conds := func() []metav1.Condition { return si.Status.Conditions }
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionCertificateReady: metav1.ConditionTrue}, 30*time.Second)
	base := desired.SidecarKind.BaseName(si.Name)
	o := ownedKeys(base, operatorNS)
	o.fetch(t, ctx, "SidecarInjector", si.UID)

	// Replace the serving certificate with one issued 80 of 90 days ago.
	caSec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}, caSec); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseKeyPair(caSec.Data[pki.SecretKeyActiveCert], caSec.Data[pki.SecretKeyActiveKey])
	if err != nil {
		t.Fatal(err)
	}
	old, err := pki.NewServingCert(ca, pki.ServingOptions{Service: base, Namespace: operatorNS, Clock: pki.FixedClock(time.Now().Add(-80 * 24 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey] = old.CertPEM, old.KeyPEM
	if err := c.Update(ctx, o.Secret); err != nil {
		t.Fatal(err)
	}
	d := timeUntil(t, ctx, "serving certificate renewed", func(ctx context.Context) (bool, error) {
		s := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(o.Secret), s); err != nil {
			return false, err
		}
		leaf, err := pki.ParseCertPEM(s.Data[corev1.TLSCertKey])
		return err == nil && time.Since(leaf.NotBefore) < time.Hour, nil
	})
	t.Logf("serving certificate due for renewal replaced in %s", d.Round(time.Millisecond))

	// Move to another namespace and drop to one replica.
	if _, err := env.CreateNamespace(ctx, "mesh-servers", nil); err != nil {
		t.Fatal(err)
	}
	if err := update(ctx, si, func() {
		si.Spec.Server.Namespace = "mesh-servers"
		si.Spec.Server.Replicas = ptr.To[int32](1)
	}); err != nil {
		t.Fatal(err)
	}
	waitConditions(t, ctx, si, conds, configured, 30*time.Second)
	moved := ownedKeys(base, "mesh-servers")
	oldNS := owned{SA: o.SA, Deploy: o.Deploy, PDB: o.PDB, Svc: o.Svc, Secret: o.Secret}
	err = cluster.WaitFor(ctx, 30*time.Second, "objects moved to mesh-servers, old ones and the PDB removed", func(ctx context.Context) (bool, error) {
		for _, obj := range []client.Object{oldNS.SA, oldNS.Deploy, oldNS.PDB, oldNS.Svc, oldNS.Secret, moved.PDB} {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)); !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		for _, obj := range []client.Object{moved.SA, moved.Deploy, moved.Svc, moved.Secret, moved.MWC, moved.Bind} {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return false, client.IgnoreNotFound(err)
			}
		}
		return moved.MWC.Webhooks[0].ClientConfig.Service.Namespace == "mesh-servers" && moved.Bind.Subjects[0].Namespace == "mesh-servers", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.ParseCertPEM(moved.Secret.Data[corev1.TLSCertKey])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(leaf.DNSNames, base+".mesh-servers.svc") {
		t.Fatalf("SANs after the move: %v", leaf.DNSNames)
	}
	sel := moved.MWC.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values
	if !slices.Contains(sel, "mesh-servers") || !slices.Contains(sel, operatorNS) {
		t.Fatalf("excluded namespaces %v", sel)
	}
	moved.PDB = &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: base + "-none", Namespace: "mesh-servers"}}
	deleteAndWait(t, ctx, si, moved)
}

// Another writer that keeps rewriting caBundle gets Max repairs per window,
// then a Warning Event and a condition naming it, and the repair resumes
// when the window allows; no endless fight.
func TestConflictingWriterBackoff(t *testing.T) {
	// Serial: beside the parallel tests on a machine with a CPU-bound job,
	// an overwrite went neither repaired nor refused for 3 min (2026-12-05,
	// run L12); not yet explained, so it keeps the operator to itself.
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	// Its webhook selects no namespace: the tests running beside it
	// create pods, which a catch-all webhook with no server would slow.
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "fought"}, Spec: v1alpha1.SidecarInjectorSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"conflict-test": "never"}},
	}}
	create(t, ctx, si)
	conds := func() []metav1.Condition { return si.Status.Conditions }
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue}, 30*time.Second)
	base := desired.SidecarKind.BaseName(si.Name)
	o := ownedKeys(base, operatorNS)
	o.fetch(t, ctx, "SidecarInjector", si.UID)
	want := string(o.MWC.Webhooks[0].ClientConfig.CABundle)
	foreign, err := cluster.NewTestCA("injector-of-another-tool")
	if err != nil {
		t.Fatal(err)
	}
	writer, err := client.New(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	overwrite := func() {
		t.Helper()
		m := o.MWC.DeepCopy()
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			t.Fatal(err)
		}
		m.Webhooks[0].ClientConfig.CABundle = foreign.CertPEM
		if err := writer.Update(ctx, m, client.FieldOwner("other-ca-injector")); err != nil {
			t.Fatal(err)
		}
	}
	repaired := func(ctx context.Context) (bool, error) {
		m := o.MWC.DeepCopy()
		err := c.Get(ctx, client.ObjectKeyFromObject(m), m)
		return err == nil && string(m.Webhooks[0].ClientConfig.CABundle) == want, nil
	}
	repairedWithin := func(d time.Duration) bool {
		_, err := cluster.Poll(ctx, 5*time.Millisecond, d, "caBundle repaired", repaired)
		return err == nil
	}
	// The operator's own word that it stopped: WebhookConfigured False
	// naming the conflict.
	refused := func(ctx context.Context) (bool, error) {
		cur := &v1alpha1.SidecarInjector{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), cur); err != nil {
			return false, err
		}
		cond := apimeta.FindStatusCondition(cur.Status.Conditions, v1alpha1.ConditionWebhookConfigured)
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == controllers.ReasonConflicting, nil
	}
	// Overwrite again as soon as each repair is seen, until the operator
	// refuses. Repair i happened between overwrite i and the poll that saw
	// it, so repair i and repair i-Max both fall within seen[i] -
	// overwrites[i-Max]: under the window, that is Max+1 repairs in one
	// window, a fight the budget must stop. A machine slow enough to
	// stretch Max repairs past the window is allowed more (so is the
	// operator); judged on those bounds, not on a 1 s wait.
	var overwrites, seen []time.Time
	for i := 0; ; i++ {
		if i >= 4*testRepairBudget.Max {
			t.Fatalf("%d overwrites repaired and never refused; repairs seen %v after overwrites at %v", i, seen, overwrites)
		}
		overwrites = append(overwrites, time.Now())
		overwrite()
		var fixed bool
		err := cluster.WaitFor(ctx, bound(60*time.Second), fmt.Sprintf("overwrite %d repaired or refused", i+1), func(ctx context.Context) (bool, error) {
			ok, err := repaired(ctx)
			if fixed = ok; ok || err != nil {
				return ok, err
			}
			return refused(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
		if !fixed {
			break
		}
		seen = append(seen, time.Now())
		if i >= testRepairBudget.Max {
			if d := seen[i].Sub(overwrites[i-testRepairBudget.Max]); d < testRepairBudget.Window {
				t.Fatalf("overwrite %d repaired: %d repairs within %s (window %s): the operator keeps fighting",
					i+1, testRepairBudget.Max+1, d.Round(time.Millisecond), testRepairBudget.Window)
			}
		}
	}
	if len(seen) < testRepairBudget.Max {
		t.Fatalf("overwrite %d not repaired: refused after %d repairs, want %d", len(seen)+1, len(seen), testRepairBudget.Max)
	}
	sixth := overwrites[len(overwrites)-1]
	t.Logf("figure: %d overwrites repaired in %s, overwrite %d refused", len(seen),
		seen[len(seen)-1].Sub(overwrites[0]).Round(time.Millisecond), len(overwrites))
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionWebhookConfigured: metav1.ConditionFalse, v1alpha1.ConditionReady: metav1.ConditionFalse,
	}, 60*time.Second)
	cond := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionWebhookConfigured)
	if cond.Reason != controllers.ReasonConflicting || !strings.Contains(cond.Message, "other-ca-injector") {
		t.Fatalf("WebhookConfigured %+v", cond)
	}
	t.Logf("condition: %s", cond.Message)
	err = cluster.WaitFor(ctx, bound(60*time.Second), "ConflictingWriter event", func(ctx context.Context) (bool, error) {
		r, err := eventReasons(ctx, "SidecarInjector", si.Name)
		return r[controllers.EventConflictingWriter] > 0, err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The window ends: repaired again, conditions recover.
	if !repairedWithin(testRepairBudget.Window + 60*time.Second) {
		t.Fatal("not repaired after the back-off window")
	}
	t.Logf("figure: repaired again %s after the refused overwrite (first of %d repairs %s before it, window %s)",
		time.Since(sixth).Round(time.Millisecond), len(seen), sixth.Sub(overwrites[0]).Round(time.Millisecond), testRepairBudget.Window)
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue}, 60*time.Second)
	deleteAndWait(t, ctx, si, o)
}

// The pause-reconcile annotation stops repairs until it is removed.
func TestPauseReconcile(t *testing.T) {
	ctx := cluster.TestContext(t, 2*time.Minute)
	c := env.Client
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "paused"}}
	create(t, ctx, si)
	conds := func() []metav1.Condition { return si.Status.Conditions }
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue}, 30*time.Second)
	o := ownedKeys(desired.SidecarKind.BaseName(si.Name), operatorNS)
	o.fetch(t, ctx, "SidecarInjector", si.UID)
	want := string(o.MWC.Webhooks[0].ClientConfig.CABundle)

	if err := update(ctx, si, func() { si.Annotations = map[string]string{controllers.PauseReconcileAnnotation: "true"} }); err != nil {
		t.Fatal(err)
	}
	// Ready may already be False (NotReady while the server Deployment
	// starts): wait for the paused reason itself.
	err := cluster.WaitFor(ctx, 60*time.Second, "Ready=False ReconcilePaused", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		r := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionReady)
		return r != nil && r.Status == metav1.ConditionFalse && r.Reason == controllers.ReasonPaused, nil
	})
	if err != nil {
		t.Fatalf("%v; conditions: %s", err, fmtConds(si.Status.Conditions))
	}
	reconciled, err := cluster.ReconcileTotal(desired.SidecarKind.Short)
	if err != nil {
		t.Fatal(err)
	}
	m := o.MWC.DeepCopy()
	if err := update(ctx, m, func() { m.Webhooks[0].ClientConfig.CABundle = nil }); err != nil {
		t.Fatal(err)
	}
	// Not repaired while paused: judged once the operator has reconciled
	// (the tamper queues the CR) and gone idle, and for 2 s more.
	err = cluster.WaitFor(ctx, 60*time.Second, "a SidecarInjector reconcile after the tamper", func(context.Context) (bool, error) {
		n, err := cluster.ReconcileTotal(desired.SidecarKind.Short)
		return n > reconciled, err
	})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, ctx)
	err = cluster.During(ctx, 2*time.Second, 100*time.Millisecond, func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if len(m.Webhooks[0].ClientConfig.CABundle) != 0 {
			return fmt.Errorf("caBundle repaired while paused")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	if err := update(ctx, si, func() { delete(si.Annotations, controllers.PauseReconcileAnnotation) }); err != nil {
		t.Fatal(err)
	}
	d := timeUntil(t, ctx, "caBundle repaired after unpausing", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return false, err
		}
		return string(m.Webhooks[0].ClientConfig.CABundle) == want, nil
	})
	t.Logf("repaired %s after the pause annotation was removed", d.Round(time.Millisecond))
	deleteAndWait(t, ctx, si, o)
}
