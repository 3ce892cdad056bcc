// Package csrsigner makes the operator a certificates.k8s.io/v1 signer
// (KEP-1513) for one signerName, default hookwright.io/webhook-serving: it
// signs approved CertificateSigningRequests for that signer with the
// installation CA (the one the operator rotates, Secret hookwright-ca) when
// internal/certificates/csrsign's policy allows them, and publishes that CA as a
// ClusterTrustBundle for the signer (KEP-3257; certificates.k8s.io/v1 and on
// by default from Kubernetes v1.37, feature gate ClusterTrustBundle in
// pkg/features/kube_features.go).
package csrsigner

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
)

// The ClusterTrustBundle of the signer: created, repaired and read, never
// deleted (its name's prefix makes the API require our signerName). Writing
// one that names a signer needs attest on signers/<signerName>
// (KEP-3257 admission plugin ClusterTrustBundleAttest).
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=clustertrustbundles,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=attest,resourceNames=hookwright.io/webhook-serving

// Labels on the published ClusterTrustBundle.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedByValue = "hookwright"
	labelComponent = "app.kubernetes.io/component"
)

// Event reasons on the CA Secret.
const (
	eventTrustBundlePublished   = "ClusterTrustBundlePublished"
	EventTrustBundleUnavailable = "ClusterTrustBundleUnavailable"
)

// clusterTrustBundleGVK is the kind published: certificates.k8s.io/v1 only
// (v1alpha1 and v1beta1 are off by default on the servers that have them).
var clusterTrustBundleGVK = schema.GroupVersionKind{Group: "certificates.k8s.io", Version: "v1", Kind: "ClusterTrustBundle"}

// TrustBundleName is the name of the ClusterTrustBundle published for
// signerName: the signer name with "/" as ":" (the API requires that
// prefix), then ":installation-ca".
func TrustBundleName(signerName string) string {
	return strings.ReplaceAll(signerName, "/", ":") + ":installation-ca"
}

// TrustBundles publishes the installation CA as the ClusterTrustBundle of
// the signer and tells others what it observed. When the API server does not
// serve certificates.k8s.io/v1 ClusterTrustBundle it publishes nothing and
// Available says why; it never fails the manager for it.
type TrustBundles struct {
	client     client.Client
	recorder   events.EventRecorder
	signerName string
	caKey      types.NamespacedName
	clock      pki.Clock

	reported atomic.Bool // the unavailable API was reported as an event

	mu          sync.Mutex
	available   bool
	unavailable string
	published   []byte // trustBundle as last read back or written
}

// Available reports whether the API serves ClusterTrustBundles, with the
// reason when not.
func (t *TrustBundles) Available() (bool, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.available, t.unavailable
}

// publishes reports whether ca is in the signer's ClusterTrustBundle as
// last observed from the API server. Always true when the API is absent
// (nothing publishes there; consumers cannot rely on it anyway).
func (t *TrustBundles) publishes(ca *x509.Certificate) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.available || pki.BundleContains(t.published, ca)
}

func (t *TrustBundles) observe(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.published = b
}

// DetectTrustBundleAPI asks the RESTMapper (discovery) whether the server
// serves certificates.k8s.io/v1 clustertrustbundles.
func DetectTrustBundleAPI(mapper apimeta.RESTMapper) (bool, string) {
	_, err := mapper.RESTMapping(clusterTrustBundleGVK.GroupKind(), clusterTrustBundleGVK.Version)
	switch {
	case err == nil:
		return true, ""
	case apimeta.IsNoMatchError(err):
		return false, "the API server does not serve certificates.k8s.io/v1 ClusterTrustBundle " +
			"(GA and on by default from Kubernetes v1.37; older servers need feature gate ClusterTrustBundle and --runtime-config certificates.k8s.io/v1beta1/clustertrustbundles=true, which this operator does not use)"
	default:
		return false, "discovery of certificates.k8s.io/v1 failed: " + err.Error()
	}
}

// Reconcile writes the ClusterTrustBundle of the CA Secret (its only key).
func (t *TrustBundles) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	sec := &corev1.Secret{}
	if err := t.client.Get(ctx, t.caKey, sec); err != nil {
		// No CA yet: the lifecycle reconcilers create it, and its event
		// brings us back.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ok, why := t.Available(); !ok {
		if !t.reported.Swap(true) {
			t.recorder.Eventf(sec, nil, corev1.EventTypeWarning, EventTrustBundleUnavailable, "Publish", why)
		}
		return reconcile.Result{}, nil
	}
	now := t.clock.Now()
	want := pki.TrustAnchors(sec.Data, now)
	if len(want) == 0 {
		return reconcile.Result{}, nil
	}
	name := TrustBundleName(t.signerName)
	live := &certificatesv1.ClusterTrustBundle{}
	err := t.client.Get(ctx, client.ObjectKey{Name: name}, live)
	switch {
	case apierrors.IsNotFound(err):
		ctb := &certificatesv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelManagedBy: managedByValue, labelComponent: "ca"}, OwnerReferences: crdOwners(sec)},
			Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: t.signerName, TrustBundle: string(want)},
		}
		if err := t.client.Create(ctx, ctb); err != nil {
			return reconcile.Result{}, fmt.Errorf("create ClusterTrustBundle %s: %w", name, err)
		}
		t.observe(want)
		t.recorder.Eventf(sec, nil, corev1.EventTypeNormal, eventTrustBundlePublished, "Publish", "ClusterTrustBundle %s created with %d CAs", name, count(want))
	case err != nil:
		return reconcile.Result{}, err
	case live.Spec.TrustBundle != string(want) || live.Labels[labelManagedBy] != managedByValue || len(sources.MissingOwners(live.OwnerReferences, crdOwners(sec))) > 0:
		live.Spec.TrustBundle = string(want)
		live.OwnerReferences = append(live.OwnerReferences, sources.MissingOwners(live.OwnerReferences, crdOwners(sec))...)
		if live.Labels == nil {
			live.Labels = map[string]string{}
		}
		live.Labels[labelManagedBy], live.Labels[labelComponent] = managedByValue, "ca"
		if err := t.client.Update(ctx, live); err != nil {
			return reconcile.Result{}, fmt.Errorf("update ClusterTrustBundle %s: %w", name, err)
		}
		t.observe(want)
		t.recorder.Eventf(sec, nil, corev1.EventTypeNormal, eventTrustBundlePublished, "Publish", "ClusterTrustBundle %s updated to %d CAs", name, count(want))
	default:
		t.observe([]byte(live.Spec.TrustBundle))
	}
	// Expired CAs leave the bundle when they expire.
	return reconcile.Result{RequeueAfter: nextExpiry(want, now)}, nil
}

func count(b []byte) int {
	cs, _ := pki.ParseCertsPEM(b)
	return len(cs)
}

func nextExpiry(b []byte, now time.Time) time.Duration {
	cs, _ := pki.ParseCertsPEM(b)
	var d time.Duration
	for _, c := range cs {
		if left := c.NotAfter.Sub(now) + time.Second; left > 0 && (d == 0 || left < d) {
			d = left
		}
	}
	return d
}

func (t *TrustBundles) setup(mgr ctrl.Manager) error {
	t.available, t.unavailable = DetectTrustBundleAPI(mgr.GetRESTMapper())
	isCA := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == t.caKey.Namespace && o.GetName() == t.caKey.Name
	})
	b := ctrl.NewControllerManagedBy(mgr).Named("clustertrustbundle").
		For(&corev1.Secret{}, builder.WithPredicates(isCA))
	if !t.available {
		mgr.GetLogger().Info("ClusterTrustBundles not published", "reason", t.unavailable)
		return b.Complete(t)
	}
	toCA := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: t.caKey}}
	})
	name := TrustBundleName(t.signerName)
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == name })
	return b.Watches(&certificatesv1.ClusterTrustBundle{}, toCA, builder.WithPredicates(ours)).Complete(t)
}

// crdOwners are the CA Secret's owner references to the installation's
// CRDs (internal/certificates/sources/owners.go): the ClusterTrustBundle is
// installation state too, so deleting the CRDs (make undeploy, operator-sdk
// cleanup) deletes it. A cluster-scoped object cannot be owned by the
// namespaced Secret itself.
func crdOwners(sec *corev1.Secret) []metav1.OwnerReference {
	var out []metav1.OwnerReference
	for _, o := range sec.OwnerReferences {
		if o.Kind == "CustomResourceDefinition" && strings.HasPrefix(o.APIVersion, "apiextensions.k8s.io/") {
			out = append(out, metav1.OwnerReference{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID})
		}
	}
	return out
}
