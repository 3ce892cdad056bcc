package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// The user's serving Secrets (certificate mode Secret) carry no operator
// label, so the manager's cache, which holds only labelled Secrets, never
// sees them. A second cache watches the metadata of every Secret, slimmed
// to namespace, name and resourceVersion (a few hundred bytes each, no
// data, no annotations), only to map a change of a Secret a CR names to
// that CR: the reconcile then reads the Secret with the API reader, and the
// new ca.crt reaches the caBundle within seconds instead of at the 5 min
// resync.

// secretMeta is the watched type: Secret metadata (a metadata-only
// informer, GET/LIST/WATCH secrets with the metadata Accept header).
func secretMeta() client.Object {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return m
}

// newUserSecretCache builds the Secret metadata cache of namespaces (the
// server namespaces: a user's serving Secret is in its server's); the
// manager starts it.
func newUserSecretCache(mgr ctrl.Manager, namespaces []string) (cache.Cache, error) {
	return cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), HTTPClient: mgr.GetHTTPClient(),
		DefaultTransform: slimSecretMeta, DefaultNamespaces: namespaceConfigs(namespaces),
	})
}

// slimSecretMeta keeps what identifies a Secret version.
func slimSecretMeta(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil // a tombstone: unchanged
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
	}}, nil
}

// userSecretSource enqueues the CRs of r's kind whose certificate mode is
// Secret and whose spec.certificate.secretName, in the server namespace,
// is the changed Secret.
func (r *reconciler) userSecretSource(c cache.Cache) source.Source {
	return source.Kind(c, secretMeta(), handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return r.usersOf(ctx, o.GetNamespace(), o.GetName())
	}))
}

// usersOf lists (from the cache) the CRs that use the Secret ns/name as
// their user-provided serving certificate.
func (r *reconciler) usersOf(ctx context.Context, ns, name string) []reconcile.Request {
	list := r.kind.NewList()
	if err := r.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "list CRs for a changed Secret")
		return nil
	}
	var reqs []reconcile.Request
	_ = apimeta.EachListItem(list, func(obj runtime.Object) error {
		op := desired.NewCR(r.kind.Kind(), obj.(v1alpha1.Object))
		if desired.CertificateMode(op) == v1alpha1.CertificateSecret && op.Certificate.SecretName == name && desired.ServerNamespace(op, r.Settings.Settings) == ns {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: op.Object.GetName()}})
		}
		return nil
	})
	return reqs
}
