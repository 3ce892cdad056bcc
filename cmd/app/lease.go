package app

import (
	"context"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/hookwright/hookwright/internal/apply"
)

// LeaseOwnerFromEnv is the operator's pod as an owner reference, from the
// downward API variables POD_NAME and POD_UID (config/manager sets them);
// false out of a pod.
func LeaseOwnerFromEnv() (metav1.OwnerReference, bool) {
	name, uid := os.Getenv("POD_NAME"), os.Getenv("POD_UID")
	if name == "" || uid == "" {
		return metav1.OwnerReference{}, false
	}
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: name, UID: types.UID(uid)}, true
}

// leaseOwnerResync is how often the leader checks that its Lease is owned
// by its pod (the Lease may have been re-created meanwhile).
const leaseOwnerResync = 30 * time.Second

// ownLease makes the leader's pod the only owner of the leader election
// Lease while it leads, so the garbage collector deletes the Lease once
// that pod is gone. Shutdown-time deletion (deleteReleasedLease) cannot be
// relied on in an uninstall: OLM deletes the CSV's Role and RoleBinding
// with the Deployment, so the stopping pod may no longer be allowed to
// delete. A pod object is removed only after its containers have stopped,
// so no leader can re-create the Lease after its owner is gone; a Lease
// deleted under a running leader is re-created by client-go's elector on
// its next renewal and owned again here. Errors are logged and retried.
func ownLease(ctx context.Context, cs kubernetes.Interface, ns, name string, pod metav1.OwnerReference) {
	l := ctrl.Log.WithName("leader-election")
	for {
		// The elector renews the Lease every 2 s, so an update may conflict
		// with it: retry at once on the fresh object rather than after the
		// resync, by which time an uninstall may have removed the pod.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			lease, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || len(lease.OwnerReferences) == 1 && lease.OwnerReferences[0].UID == pod.UID {
				return err
			}
			lease.OwnerReferences = []metav1.OwnerReference{pod}
			if _, err = cs.CoordinationV1().Leases(ns).Update(ctx, lease, metav1.UpdateOptions{FieldManager: apply.FieldManager}); err != nil {
				return err
			}
			l.Info("leader Lease owned by this pod", "lease", ns+"/"+name, "pod", pod.Name)
			return nil
		})
		if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			l.Error(err, "own leader Lease", "lease", ns+"/"+name)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaseOwnerResync):
		}
	}
}

// deleteReleasedLease deletes the leader election Lease ns/name if nobody
// holds it (this replica released it on shutdown), with its
// resourceVersion as a precondition, so a Lease another replica has taken
// meanwhile stays. Every stop of the operator thus leaves no Lease behind,
// an uninstall included (nothing else would delete it: no owner can be set
// through controller-runtime's leader election, and one that the CRDs
// owned would be re-created by the running leader while an uninstall
// deletes the CRDs before the operator). The next leader creates a new
// Lease, as on a first start. Errors are only logged: the process exits.
func deleteReleasedLease(cfg *rest.Config, ns, name string) {
	l := ctrl.Log.WithName("leader-election")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		l.Error(err, "delete released Lease")
		return
	}
	lease, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			l.Error(err, "read Lease after release", "lease", ns+"/"+name)
		}
		return
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		return // another replica leads
	}
	err = cs.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion},
	})
	switch {
	case err == nil:
		l.Info("released Lease deleted", "lease", ns+"/"+name)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
	default:
		l.Error(err, "delete released Lease", "lease", ns+"/"+name)
	}
}
