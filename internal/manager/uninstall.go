package manager

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/failopen"
)

// failOpenIfGone runs as the manager exits: when failopen.OperatorGone,
// every webhook configuration the operator manages (the CRs' mutating ones
// and its own validating one) is switched to failurePolicy Ignore, so CRs
// left behind (OLM keeps CRDs and CRs on uninstall) never block pod
// creates or CR writes with nobody renewing their certificates. Ignore
// rather than delete: while the servers still run, pods keep getting their
// sidecars, and an operator installed again re-arms Fail after its probe
// (health.DecideFailurePolicy). deployment "" turns this off (out of
// cluster, tests).
//
// This step works for `kubectl scale --replicas=0` and for deletes that
// leave the operator's RBAC in place. Helm, OLM (the CSV's garbage
// collection) and `kubectl delete -k` delete the operator's
// ServiceAccount, ClusterRole and bindings within milliseconds of its
// Deployment, long before this pod gets SIGTERM, so these calls are
// refused there: the injector servers, which outlive the operator, switch
// their own configurations instead (cmd/failopen.go, docs/failsafe.md).
func failOpenIfGone(cfg *rest.Config, namespace, deployment string) {
	if deployment == "" {
		return
	}
	log := ctrl.Log.WithName("uninstall")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Error(err, "client")
		return
	}
	dep, err := cs.AppsV1().Deployments(namespace).Get(ctx, deployment, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		dep = nil
	case err != nil:
		log.Error(err, "cannot tell whether the operator is uninstalled; webhook configurations left as they are")
		return
	}
	if !failopen.OperatorGone(dep, dep != nil) {
		return
	}
	sel := metav1.ListOptions{LabelSelector: desired.LabelManagedBy + "=" + desired.ManagedByValue}
	mwcs, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, sel)
	if err != nil {
		log.Error(err, "list mutating webhook configurations")
	} else {
		for i := range mwcs.Items {
			m := &mwcs.Items[i]
			patch, _ := failopen.MutatingPatch(m)
			if patch == nil {
				continue
			}
			if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, m.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
				log.Error(err, "switch to Ignore", "configuration", m.Name)
			} else {
				log.Info("operator uninstalled: switched to failurePolicy Ignore", "configuration", m.Name)
			}
		}
	}
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, desired.ValidatingConfigName, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			log.Error(err, "get the validating webhook configuration")
		}
		return
	}
	patch, _ := failopen.ValidatingPatch(v)
	if patch == nil {
		return
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, v.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		log.Error(err, "switch to Ignore", "configuration", v.Name)
	} else {
		log.Info("operator uninstalled: switched to failurePolicy Ignore", "configuration", v.Name)
	}
}
