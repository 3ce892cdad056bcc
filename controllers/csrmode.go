package controllers

import (
	"context"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers/csrsigner"
	"github.com/hookwright/hookwright/controllers/csrsource"
	"github.com/hookwright/hookwright/internal/certs"
)

// EventCSR reports a CertificateSigningRequest of mode CSR that was denied
// or failed, or whose signer does not answer (Warning).
const EventCSR = "CertificateSigningRequest"

// CSRSettings configure mode CSR.
type CSRSettings struct {
	// Trust is the operator's own signer's ClusterTrustBundle publisher
	// (csrsigner.Setup); nil when the signer is off.
	Trust *csrsigner.TrustBundles
	// OwnSigner is the operator's signerName (--csr-signer-name).
	OwnSigner string
	// SignerWait is how long an approved CSR may stay unsigned before the
	// condition says the signer does not answer; 0 means csrmode.DefaultSignerWait.
	SignerWait time.Duration
}

// newCSRSource is the mode CSR shell of a reconciler.
func newCSRSource(mgr ctrl.Manager, s Settings) *csrsource.Source {
	cs, err := kubernetes.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		mgr.GetLogger().Error(err, "no clientset: mode CSR cannot approve")
	}
	clock := s.Certificates.Clock
	if clock == nil {
		clock = certs.RealClock
	}
	src := &csrsource.Source{
		Client: mgr.GetClient(), API: mgr.GetAPIReader(), Clientset: cs, Scheme: mgr.GetScheme(),
		Trust: s.CSR.Trust, OwnSigner: s.CSR.OwnSigner,
		CASecret: types.NamespacedName{Namespace: s.Namespace, Name: CASecretName},
		Clock:    clock, DrainGrace: s.Certificates.drainGrace(), SignerWait: s.CSR.SignerWait,
		RenewFraction: s.Certificates.Policy.ServingRenewFraction,
	}
	if s.CSR.Trust == nil {
		ok, why := csrsigner.DetectTrustBundleAPI(mgr.GetRESTMapper())
		src.TrustAPI = func() (bool, string) { return ok, why }
	}
	return src
}

// csrMode runs mode CSR for op: its certificate state and the Secrets it
// keeps. A denied or failed request, or a silent signer, is a Warning
// Event once per condition reason.
func (r *Reconciler) csrMode(ctx context.Context, op Operand) (CertState, []client.Object, error) {
	base := op.Kind.BaseName(op.Object.GetName())
	ns := ServerNamespace(op, r.Settings)
	var spec v1alpha1.CSRCertificate
	if op.Certificate.CSR != nil {
		spec = *op.Certificate.CSR
	}
	res, err := r.csr.Reconcile(ctx, csrsource.Target{
		Owner: op.Object, Labels: CommonLabels(op), Namespace: ns, SecretName: ServingSecretName(op), Base: base,
		WebhookConfig: base, Service: base, DNSNames: certs.ServingDNSNames(base, ns, ""), CSR: spec,
		RenewToken: op.Object.GetAnnotations()[v1alpha1.AnnotationRenewCertificate],
	})
	if err != nil {
		return CertState{}, nil, err
	}
	if c := apimeta.FindStatusCondition(*op.Conditions, v1alpha1.ConditionCertificateReady); res.Warning != "" && (c == nil || c.Reason != res.Reason) {
		r.Recorder.Eventf(op.Object, nil, corev1.EventTypeWarning, EventCSR, "Request", res.Warning)
	}
	if res.Issued {
		r.Recorder.Eventf(op.Object, nil, corev1.EventTypeNormal, EventCertificateIssued, "Issue",
			"serving certificate %s/%s issued by signer %s, valid until %s", ns, ServingSecretName(op), spec.SignerName, fmtTime(res.NotAfter))
	}
	return CertState{
		CABundle: res.CABundle, NotAfter: res.NotAfter, Issued: res.Issued,
		Ready: res.Ready, Reason: res.Reason, Message: res.Message, RequeueAfter: res.RequeueAfter,
	}, res.Owned, nil
}

// csrWatches re-reconciles a CR when one of its CSRs changes (approval,
// issuance, denial) and every CR when a ClusterTrustBundle does (its
// signer's trust moved).
func (r *Reconciler) csrWatches(b *builder.Builder) *builder.Builder {
	b = b.Owns(&certificatesv1.CertificateSigningRequest{})
	ok := true
	if r.csr.Trust != nil {
		ok, _ = r.csr.Trust.Available()
	} else if r.csr.TrustAPI != nil {
		ok, _ = r.csr.TrustAPI()
	}
	if ok {
		b = b.Watches(&certificatesv1.ClusterTrustBundle{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return r.allRequests(ctx)
		}))
	}
	return b
}
