package controllers

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// +kubebuilder:rbac:groups=apps,namespace=system,resources=controllerrevisions,verbs=get;list;watch;create;patch;delete

// revisionKeeper keeps a SidecarInjector's last fleet.HistoryLimit
// revisions as ControllerRevisions in the operator's namespace, named
// <name>-<revision>, owned by the CR (the garbage collector removes them
// with it), labelled with the injector's name, data the
// sidecar.RevisionContent, as a Deployment keeps ReplicaSets and a
// DaemonSet or StatefulSet ControllerRevisions
// (k8s.io/kubernetes/pkg/controller/history).
type revisionKeeper struct {
	Client    client.Client
	Namespace string
}

// AfterApply sets status.revision and, with a keeper, records it in the
// revision history.
func (k sidecarKind) AfterApply(ctx context.Context, cr v1alpha1.Object) (time.Duration, error) {
	si := cr.(*v1alpha1.SidecarInjector)
	rev, data := sidecar.Revision(si)
	si.Status.Revision = rev
	if k.revisions == nil {
		return 0, nil
	}
	return 0, k.revisions.keep(ctx, si, rev, data)
}

func revisionName(cr, rev string) string { return cr + "-" + rev }

func (k *revisionKeeper) keep(ctx context.Context, si *v1alpha1.SidecarInjector, rev string, data []byte) error {
	list := &appsv1.ControllerRevisionList{}
	if err := k.Client.List(ctx, list, client.InNamespace(k.Namespace), client.MatchingLabels{v1alpha1.SidecarInjectorLabelKey: si.Name}); err != nil {
		return fmt.Errorf("list ControllerRevisions: %w", err)
	}
	var kept []fleet.Kept
	byName := map[string]*appsv1.ControllerRevision{}
	for i := range list.Items {
		cr := &list.Items[i]
		if !ownedBy(cr, si) {
			continue
		}
		byName[cr.Name] = cr
		kept = append(kept, fleet.Kept{Name: cr.Name, Hash: cr.Labels[v1alpha1.SidecarRevisionKey], Number: cr.Revision})
	}
	plan := fleet.PlanHistory(kept, rev, fleet.HistoryLimit)
	if plan.Create != 0 {
		obj := &appsv1.ControllerRevision{
			ObjectMeta: metav1.ObjectMeta{
				Name: revisionName(si.Name, rev), Namespace: k.Namespace,
				Labels: map[string]string{
					desired.LabelManagedBy: desired.ManagedByValue, v1alpha1.SidecarInjectorLabelKey: si.Name,
					v1alpha1.SidecarRevisionKey: rev,
				},
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: v1alpha1.GroupVersion.String(), Kind: desired.SidecarKind.Name, Name: si.Name, UID: si.UID,
					Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
				}},
			},
			Data:     runtime.RawExtension{Raw: data},
			Revision: plan.Create,
		}
		// AlreadyExists: the cache has not seen our last create yet.
		if err := k.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ControllerRevision %s: %w", obj.Name, err)
		}
	}
	if plan.Renumber != nil {
		obj := byName[plan.Renumber.Name]
		patch := client.MergeFrom(obj.DeepCopy())
		obj.Revision = plan.RenumberTo
		if err := k.Client.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("renumber ControllerRevision %s: %w", obj.Name, err)
		}
	}
	for _, d := range plan.Delete {
		if err := k.Client.Delete(ctx, byName[d.Name]); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete ControllerRevision %s: %w", d.Name, err)
		}
	}
	return nil
}

func ownedBy(o metav1.Object, si *v1alpha1.SidecarInjector) bool {
	for _, r := range o.GetOwnerReferences() {
		if r.UID == si.UID {
			return true
		}
	}
	return false
}
