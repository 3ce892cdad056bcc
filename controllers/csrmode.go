package controllers

import (
	"context"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/controllers/csrsigner"
	"github.com/hookwright/hookwright/internal/certificates/sources"
)

// Mode CSR approves its own requests (spec.certificate.csr.approve)
// through the approval subresource, which also needs approve on the signer
// (plugin/pkg/admission/certificates/approval); for another signerName
// grant approve on signers/<that name> as well. Its CSRs are deleted once
// replaced (generated names: no resourceNames).
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=approve,resourceNames=hookwright.io/webhook-serving
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=clustertrustbundles,verbs=get;list;watch

// csrSettings completes mode CSR's settings: whether ClusterTrustBundles
// are served (asked of discovery when the signer's publisher is not
// there to say) and a clientset for approvals.
func csrSettings(mgr ctrl.Manager, s sources.CSRSettings) sources.CSRSettings {
	if s.Trust == nil {
		ok, why := csrsigner.DetectTrustBundleAPI(mgr.GetRESTMapper())
		s.Trust = sources.StaticTrustAPI{OK: ok, Why: why}
	}
	if s.Clientset == nil {
		cs, err := kubernetes.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
		if err != nil {
			mgr.GetLogger().Error(err, "no clientset: mode CSR cannot approve its requests")
		} else {
			s.Clientset = cs
		}
	}
	return s
}

// csrWatches re-reconciles a CR when one of its CSRs changes (approval,
// issuance, denial) and every CR when a ClusterTrustBundle does (its
// signer's trust moved; only where the API is served).
func (r *reconciler) csrWatches(b *builder.Builder) *builder.Builder {
	b = b.Owns(&certificatesv1.CertificateSigningRequest{})
	if ok, _ := r.Settings.CSR.Trust.Available(); ok {
		b = b.Watches(&certificatesv1.ClusterTrustBundle{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return r.allRequests(ctx)
		}))
	}
	return b
}
