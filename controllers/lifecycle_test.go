package controllers

import (
	"context"
	"testing"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
)

// fakeLifecycle is a SidecarInjector reconciler and the CA controller on
// controller-runtime's fake client (no control plane): fast checks of the
// phases of Reconcile. withCertManager registers cert-manager's kinds, as
// if its CRDs were installed.
func fakeLifecycle(t *testing.T, withCertManager bool, objs ...client.Object) (*reconciler, *sources.CAReconciler, client.Client) {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if withCertManager {
		if err := AddToScheme(s); err != nil {
			t.Fatal(err)
		}
	}
	// An empty RESTMapper with cert-manager's Certificate when it is
	// "installed" (the reconciler asks it whether the CRD is served).
	rm := apimeta.NewDefaultRESTMapper(nil)
	if withCertManager {
		for _, k := range []string{cmapi.CertificateKind, cmapi.IssuerKind} {
			rm.Add(cmapi.SchemeGroupVersion.WithKind(k), apimeta.RESTScopeNamespace)
		}
	}
	c := fake.NewClientBuilder().WithScheme(s).WithRESTMapper(rm).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.SidecarInjector{}, &v1alpha1.NodeOversell{}).Build()
	r := &reconciler{
		Client: c, APIReader: c, Scheme: s, Recorder: &events.FakeRecorder{},
		Settings: testSettings, kind: sidecarKind{}, shared: &shared{status: newStatusWriter(c, c)},
		Now: func() time.Time { return t0 },
	}
	r.Settings.Certificates.Clock = pki.FixedClock(t0)
	r.applier = newApplier(r)
	r.sources = sources.New(r.certEnv())
	ca := &sources.CAReconciler{Env: r.certEnv()}
	return r, ca, c
}

func reconcileAll(t *testing.T, r *reconciler, ca *sources.CAReconciler, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := ca.Reconcile(ctx, reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, requestFor(name)); err != nil {
		t.Fatal(err)
	}
}

func conditionsOf(t *testing.T, c client.Client, name string) map[string]metav1.Condition {
	t.Helper()
	si := &v1alpha1.SidecarInjector{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, si); err != nil {
		t.Fatal(err)
	}
	out := map[string]metav1.Condition{}
	for _, cond := range si.Status.Conditions {
		out[cond.Type] = cond
	}
	return out
}

func exists(t *testing.T, c client.Client, obj client.Object) bool {
	t.Helper()
	err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// userSecret is a valid serving Secret for si in mode Secret, signed by a CA of its own.
func userSecret(t *testing.T, si *v1alpha1.SidecarInjector, name string) *corev1.Secret {
	t.Helper()
	ca, err := pki.NewCA(pki.CAOptions{CommonName: "user-ca", Clock: pki.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	base := desired.SidecarKind.BaseName(si.Name)
	kp, err := pki.NewServingCert(ca, pki.ServingOptions{DNSNames: pki.ServingDNSNames(base, testSettings.Namespace, ""), Clock: pki.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testSettings.Namespace},
		Data:       map[string][]byte{corev1.TLSCertKey: kp.CertPEM, corev1.TLSPrivateKeyKey: kp.KeyPEM, desired.SecretKeyCA: ca.CertPEM},
	}
}

// TestReconcilePhases covers mode handling, webhook gating, pause and
// Ready aggregation, one reconcile (CA controller, then the CR) per case.
func TestReconcilePhases(t *testing.T) {
	type want struct {
		status  map[string]metav1.ConditionStatus
		reasons map[string]string
		webhook bool // the MutatingWebhookConfiguration is written
		bundle  bool // ... with a non-empty caBundle
		deploy  bool
	}
	for _, tc := range []struct {
		name      string
		mutate    func(*v1alpha1.SidecarInjector)
		extra     func(*testing.T, *v1alpha1.SidecarInjector) []client.Object
		noCA      bool // only the CR's reconcile: the CA controller has not run
		certMgr   bool
		available bool // the Deployment reports available replicas
		want      want
	}{
		{name: "SelfSigned before the CA exists: no configuration", noCA: true, want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionCertificateReady: "False", v1alpha1.ConditionWebhookConfigured: "False", v1alpha1.ConditionReady: "False"},
			reasons: map[string]string{v1alpha1.ConditionCertificateReady: sources.ReasonCAUnusable, v1alpha1.ConditionWebhookConfigured: reasonNoCertificate, v1alpha1.ConditionReady: reasonNotReady},
			deploy:  true,
		}},
		{name: "SelfSigned, server not yet available", want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionCertificateReady: "True", v1alpha1.ConditionWebhookConfigured: "True", v1alpha1.ConditionServerAvailable: "False", v1alpha1.ConditionReady: "False"},
			reasons: map[string]string{v1alpha1.ConditionCertificateReady: sources.ReasonIssued, v1alpha1.ConditionServerAvailable: reasonUnavailable, v1alpha1.ConditionReady: reasonNotReady},
			webhook: true, bundle: true, deploy: true,
		}},
		{name: "SelfSigned, server available: Ready", available: true, want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionServerAvailable: "True", v1alpha1.ConditionEndpointsOwned: "True", v1alpha1.ConditionReady: "True"},
			reasons: map[string]string{v1alpha1.ConditionReady: reasonReady},
			webhook: true, bundle: true, deploy: true,
		}},
		{name: "Secret mode, Secret missing: no configuration", mutate: func(si *v1alpha1.SidecarInjector) {
			si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "my-tls"}
		}, want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionCertificateReady: "False", v1alpha1.ConditionWebhookConfigured: "False"},
			reasons: map[string]string{v1alpha1.ConditionCertificateReady: sources.ReasonSecretMissing, v1alpha1.ConditionWebhookConfigured: reasonNoCertificate},
			deploy:  true,
		}},
		{name: "Secret mode, valid Secret: its ca.crt published", mutate: func(si *v1alpha1.SidecarInjector) {
			si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "my-tls"}
		}, extra: func(t *testing.T, si *v1alpha1.SidecarInjector) []client.Object {
			return []client.Object{userSecret(t, si, "my-tls")}
		}, want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionCertificateReady: "True", v1alpha1.ConditionWebhookConfigured: "True"},
			reasons: map[string]string{v1alpha1.ConditionCertificateReady: sources.ReasonValid},
			webhook: true, bundle: true, deploy: true,
		}},
		{name: "CertManager mode without cert-manager", mutate: func(si *v1alpha1.SidecarInjector) {
			si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateCertManager}
		}, want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionCertificateReady: "False", v1alpha1.ConditionWebhookConfigured: "False"},
			reasons: map[string]string{v1alpha1.ConditionCertificateReady: sources.ReasonCertManagerNotInstalled},
			deploy:  true,
		}},
		{name: "CertManager mode, Certificate not issued yet", certMgr: true, mutate: func(si *v1alpha1.SidecarInjector) {
			si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateCertManager}
		}, want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionCertificateReady: "False", v1alpha1.ConditionWebhookConfigured: "False"},
			reasons: map[string]string{v1alpha1.ConditionCertificateReady: sources.ReasonCertificatePending},
			deploy:  true,
		}},
		{name: "paused: nothing written", mutate: func(si *v1alpha1.SidecarInjector) {
			si.Annotations = map[string]string{PauseReconcileAnnotation: "true"}
		}, want: want{
			status:  map[string]metav1.ConditionStatus{v1alpha1.ConditionReady: "False"},
			reasons: map[string]string{v1alpha1.ConditionReady: ReasonPaused},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			si := testInjector()
			if tc.mutate != nil {
				tc.mutate(si)
			}
			objs := []client.Object{si}
			if tc.extra != nil {
				objs = append(objs, tc.extra(t, si)...)
			}
			r, ca, c := fakeLifecycle(t, tc.certMgr, objs...)
			ctx := context.Background()
			if tc.noCA {
				if _, err := r.Reconcile(ctx, requestFor(si.Name)); err != nil {
					t.Fatal(err)
				}
			} else {
				reconcileAll(t, r, ca, si.Name)
			}
			dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: desired.SidecarKind.BaseName(si.Name), Namespace: testSettings.Namespace}}
			if tc.available {
				if !exists(t, c, dep) {
					t.Fatal("no Deployment")
				}
				dep.Status.AvailableReplicas = 2
				if err := c.Status().Update(ctx, dep); err != nil {
					t.Fatal(err)
				}
				reconcileAll(t, r, ca, si.Name)
			}
			got := conditionsOf(t, c, si.Name)
			for typ, st := range tc.want.status {
				if got[typ].Status != st {
					t.Errorf("%s is %s (%s: %s), want %s", typ, got[typ].Status, got[typ].Reason, got[typ].Message, st)
				}
			}
			for typ, reason := range tc.want.reasons {
				if got[typ].Reason != reason {
					t.Errorf("%s reason %s (%s), want %s", typ, got[typ].Reason, got[typ].Message, reason)
				}
			}
			mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: desired.SidecarKind.BaseName(si.Name)}}
			if w := exists(t, c, mwc); w != tc.want.webhook {
				t.Errorf("configuration written: %v, want %v", w, tc.want.webhook)
			} else if w && (len(mwc.Webhooks[0].ClientConfig.CABundle) > 0) != tc.want.bundle {
				t.Errorf("caBundle of %d bytes, want one: %v", len(mwc.Webhooks[0].ClientConfig.CABundle), tc.want.bundle)
			}
			if d := exists(t, c, &appsv1.Deployment{ObjectMeta: dep.ObjectMeta}); d != tc.want.deploy {
				t.Errorf("Deployment written: %v, want %v", d, tc.want.deploy)
			}
		})
	}
}

// TestReconcilePrunes: objects no longer desired are deleted (the PDB when
// replicas drop to 1, the SelfSigned serving Secret when the mode leaves
// SelfSigned), and only those.
func TestReconcilePrunes(t *testing.T) {
	si := testInjector()
	r, ca, c := fakeLifecycle(t, false, si, userSecret(t, si, "my-tls"))
	ctx := context.Background()
	reconcileAll(t, r, ca, si.Name)
	base := desired.SidecarKind.BaseName(si.Name)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: base, Namespace: testSettings.Namespace}}
	serving := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: base + "-tls", Namespace: testSettings.Namespace}}
	if !exists(t, c, pdb) || !exists(t, c, serving) {
		t.Fatal("PDB or serving Secret not created")
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
		t.Fatal(err)
	}
	si.Spec.Server.Replicas = ptr.To[int32](1)
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "my-tls"}
	if err := c.Update(ctx, si); err != nil {
		t.Fatal(err)
	}
	reconcileAll(t, r, ca, si.Name)
	if exists(t, c, pdb) {
		t.Error("PDB kept with 1 replica")
	}
	if exists(t, c, serving) {
		t.Error("SelfSigned serving Secret kept in mode Secret")
	}
	if !exists(t, c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-tls", Namespace: testSettings.Namespace}}) {
		t.Error("the user's Secret was deleted")
	}
	if !exists(t, c, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: base, Namespace: testSettings.Namespace}}) {
		t.Error("Deployment deleted")
	}
	if cond := conditionsOf(t, c, si.Name)[v1alpha1.ConditionCertificateReady]; cond.Status != metav1.ConditionTrue || cond.Reason != sources.ReasonValid {
		t.Errorf("after the switch to mode Secret, CertificateReady %s (%s: %s)", cond.Status, cond.Reason, cond.Message)
	}
}
