package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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
	Client client.Client
	// Reader reads the SidecarInjector live after a create (nil: no check).
	Reader    client.Reader
	Namespace string
}

// AfterApply records the spec's revision in the history (with a keeper),
// resolves spec.revision into status.pinned from its ControllerRevision,
// and sets status.revision to the revision served. A spec.revision that is
// not kept is an error of the reconcile (Ready False naming it); the
// servers then keep what they serve.
func (k sidecarKind) AfterApply(ctx context.Context, cr v1alpha1.Object) (time.Duration, error) {
	si := cr.(*v1alpha1.SidecarInjector)
	rev, data := sidecar.Revision(si)
	if k.revisions == nil {
		if si.Spec.Revision == "" {
			si.Status.Revision, si.Status.Pinned = rev, nil
		}
		return 0, nil
	}
	kept, err := k.revisions.keep(ctx, si, rev, data)
	if err != nil {
		return 0, err
	}
	if si.Spec.Revision == "" {
		si.Status.Revision, si.Status.Pinned = rev, nil
		return 0, nil
	}
	cr0, ok := kept[si.Spec.Revision]
	if !ok {
		si.Status.Pinned = nil
		return 0, fmt.Errorf("spec.revision %s is not a kept revision of SidecarInjector %s (ControllerRevisions %s-<revision> in %s)", si.Spec.Revision, si.Name, si.Name, k.revisions.Namespace)
	}
	var rc sidecar.RevisionContent
	if err := json.Unmarshal(cr0.Data.Raw, &rc); err != nil {
		return 0, fmt.Errorf("ControllerRevision %s: %w", cr0.Name, err)
	}
	si.Status.Pinned = &v1alpha1.PinnedRevision{Revision: si.Spec.Revision, Templates: rc.Templates,
		DefaultTemplates: rc.DefaultTemplates, Values: rc.Values, NativeSidecars: rc.NativeSidecars}
	si.Status.Revision = si.Spec.Revision
	return 0, nil
}

func revisionName(cr, rev string) string { return cr + "-" + rev }

// keep records rev in si's history and prunes it (never the pinned
// revision); it returns the kept ControllerRevisions by revision.
func (k *revisionKeeper) keep(ctx context.Context, si *v1alpha1.SidecarInjector, rev string, data []byte) (map[string]*appsv1.ControllerRevision, error) {
	list := &appsv1.ControllerRevisionList{}
	if err := k.Client.List(ctx, list, client.InNamespace(k.Namespace), client.MatchingLabels{v1alpha1.SidecarInjectorLabelKey: si.Name}); err != nil {
		return nil, fmt.Errorf("list ControllerRevisions: %w", err)
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
	byHash := map[string]*appsv1.ControllerRevision{}
	for _, c := range byName {
		byHash[c.Labels[v1alpha1.SidecarRevisionKey]] = c
	}
	plan := fleet.PlanHistory(kept, rev, si.Spec.Revision, fleet.HistoryLimit)
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
		if gone, err := k.create(ctx, si, obj); err != nil || gone {
			return nil, err
		}
		byHash[rev] = obj
	}
	if plan.Renumber != nil {
		obj := byName[plan.Renumber.Name]
		patch := client.MergeFrom(obj.DeepCopy())
		obj.Revision = plan.RenumberTo
		if err := k.Client.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("renumber ControllerRevision %s: %w", obj.Name, err)
		}
	}
	for _, d := range plan.Delete {
		if err := k.Client.Delete(ctx, byName[d.Name]); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("delete ControllerRevision %s: %w", d.Name, err)
		}
		if byHash[d.Hash] == byName[d.Name] {
			delete(byHash, d.Hash)
		}
	}
	return byHash, nil
}

// createCheckTimeout bounds a revision's create and the owner check after
// it, which run on even when the manager is stopping (see create).
const createCheckTimeout = 10 * time.Second

// create creates obj, si's revision, and then checks that si still
// exists (ownerGone). The two run under a context the manager's shutdown
// does not cancel: uninstalling (operator-sdk cleanup) deletes the CRDs
// and the operator's Deployment within a second, and a reconcile stopped
// between the create and the check, or during a create the API server
// had already stored, left a revision no one removes (seen in
// test/e2e's README block, 2026-12-05). The pod's termination grace and
// the manager's graceful shutdown both outlast createCheckTimeout.
func (k *revisionKeeper) create(ctx context.Context, si *v1alpha1.SidecarInjector, obj *appsv1.ControllerRevision) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createCheckTimeout)
	defer cancel()
	// AlreadyExists: the cache has not seen our last create yet.
	err := k.Client.Create(ctx, obj)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		// It may have been stored all the same (a timeout): check.
		if gone, gerr := k.ownerGone(ctx, si); gerr == nil && gone {
			return true, nil
		}
		return false, fmt.Errorf("create ControllerRevision %s: %w", obj.Name, err)
	}
	return k.ownerGone(ctx, si)
}

// ownerGone reads si live after a ControllerRevision was created for it.
// A reconcile that read si from the cache just before its deletion
// creates the revision after the garbage collector last looked at si's
// dependents; if the CRD goes too (operator-sdk cleanup), the collector
// cannot resolve the owner's kind and keeps the revision forever
// (pkg/controller/garbagecollector, restMappingError). So a revision
// whose owner is gone or going is deleted here; a deletion after this
// read finds the revision in the collector's graph.
func (k *revisionKeeper) ownerGone(ctx context.Context, si *v1alpha1.SidecarInjector) (bool, error) {
	if k.Reader == nil {
		return false, nil
	}
	live := &v1alpha1.SidecarInjector{}
	err := k.Reader.Get(ctx, client.ObjectKeyFromObject(si), live)
	// NoKindMatch: the CRD is gone, and with it every SidecarInjector.
	if err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
		return false, fmt.Errorf("read SidecarInjector %s after creating its revision: %w", si.Name, err)
	}
	if err == nil && live.UID == si.UID && live.DeletionTimestamp.IsZero() {
		return false, nil
	}
	list := &appsv1.ControllerRevisionList{}
	if err := k.Reader.List(ctx, list, client.InNamespace(k.Namespace), client.MatchingLabels{v1alpha1.SidecarInjectorLabelKey: si.Name}); err != nil {
		return true, fmt.Errorf("list ControllerRevisions of deleted SidecarInjector %s: %w", si.Name, err)
	}
	for i := range list.Items {
		if ownedBy(&list.Items[i], si) {
			if err := k.Client.Delete(ctx, &list.Items[i]); client.IgnoreNotFound(err) != nil {
				return true, fmt.Errorf("delete ControllerRevision %s of deleted SidecarInjector %s: %w", list.Items[i].Name, si.Name, err)
			}
		}
	}
	return true, nil
}

func ownedBy(o metav1.Object, si *v1alpha1.SidecarInjector) bool {
	for _, r := range o.GetOwnerReferences() {
		if r.UID == si.UID {
			return true
		}
	}
	return false
}
