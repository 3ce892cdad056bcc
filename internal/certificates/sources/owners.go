package sources

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
)

// The installation's own state (the CA Secret, the manager's serving
// Secret and the ValidatingWebhookConfiguration hookwright-validation) is
// owned by the two CRDs: it exists to serve those APIs, so it lives as long
// as they do and the garbage collector removes it with the last of them.
// Every uninstall that removes the API removes it too: `make undeploy`
// (config/default holds the CRDs), `operator-sdk cleanup` (deletes the
// CSV's CRDs) and kubectl delete of the CRDs after an OLM uninstall. An
// uninstall that keeps the CRDs (OLM's default: CSV and Subscription only)
// keeps the CRs and this state with them, so a reinstall finds the same
// CA and re-issues nothing. The CRDs keep their UID across OLM upgrades
// (updated in place), so an upgrade never loses it. No cluster-scoped
// object can be owned by the namespaced CSV (KEP-1465, owner references:
// such a reference is unresolvable), and OLM's webhookdefinitions would
// replace the operator's CA and caBundle management with OLM's and leave
// `make deploy` without a webhook.
//
// The references set neither controller nor blockOwnerDeletion: deleting
// a CRD never waits for them, and no finalizers permission on CRDs is
// needed (the OwnerReferencesPermissionEnforcement admission plugin).

// InstallationCRDs are the names of the CRDs that own the installation's
// state.
var InstallationCRDs = []string{
	"sidecarinjectors." + v1alpha1.GroupVersion.Group,
	"nodeoversells." + v1alpha1.GroupVersion.Group,
}

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// InstallationOwners returns an owner reference to each InstallationCRD
// that exists and is not being deleted, read (metadata only) through r.
// Empty means the API is going away: callers then create nothing.
func InstallationOwners(ctx context.Context, r client.Reader) ([]metav1.OwnerReference, error) {
	var out []metav1.OwnerReference
	for _, name := range InstallationCRDs {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(crdGVK)
		switch err := r.Get(ctx, client.ObjectKey{Name: name}, m); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("CRD %s: %w", name, err)
		}
		if m.DeletionTimestamp != nil {
			continue
		}
		out = append(out, metav1.OwnerReference{
			APIVersion: crdGVK.GroupVersion().String(), Kind: crdGVK.Kind, Name: name, UID: m.UID,
		})
	}
	return out, nil
}

// AddOwners patches obj (as read) to carry owners too, if it lacks any:
// installations from before the owners were set get them.
func AddOwners(ctx context.Context, c client.Client, obj client.Object, owners []metav1.OwnerReference) error {
	missing := MissingOwners(obj.GetOwnerReferences(), owners)
	if len(missing) == 0 {
		return nil
	}
	base := obj.DeepCopyObject().(client.Object)
	obj.SetOwnerReferences(append(obj.GetOwnerReferences(), missing...))
	if err := c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(apply.FieldManager)); err != nil {
		return fmt.Errorf("owner references of %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	return nil
}
