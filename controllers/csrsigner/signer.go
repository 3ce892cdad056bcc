package csrsigner

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/csrsign"
	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// Signing a CSR is a status update plus sign on the signer
// (k8s.io/kubernetes plugin/pkg/admission/certificates/signing); Services
// named by a request are read where servers may run (the namespaced Role).
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=sign,resourceNames=hookwright.io/webhook-serving

// Event reasons on a CSR.
const (
	eventSigned         = "CertificateSigned"
	EventSigningRefused = "SigningRefused"
)

// waitPoll is how often a CSR is looked at again while the CA it would be
// signed with is not yet published in the ClusterTrustBundle.
const waitPoll = time.Second

// Options configure the signer.
type Options struct {
	// SignerName signed and published for; empty means v1alpha1.DefaultCSRSignerName.
	SignerName string
	// CASecret is the installation CA Secret (pki.SecretKey* data).
	CASecret types.NamespacedName
	// Namespaces are the allowed server namespaces: only their Services' names are signed.
	Namespaces []string
	// ClusterDomain accepted after ".svc"; empty means cluster.local.
	ClusterDomain string
	// MaxValidity of signed certificates; 0 means csrsign.DefaultMaxValidity.
	MaxValidity time.Duration
	// Clock of signing decisions; nil is the system clock.
	Clock pki.Clock
}

// signer signs approved CSRs for its signerName.
type signer struct {
	client   client.Client
	api      client.Reader
	recorder events.EventRecorder
	o        Options
	trust    *TrustBundles
}

// Setup adds the signer and the ClusterTrustBundle publisher to mgr and
// returns the publisher (what it observed, for the CSR mode).
func Setup(mgr ctrl.Manager, o Options) (*TrustBundles, error) {
	if o.SignerName == "" {
		o.SignerName = v1alpha1.DefaultCSRSignerName
	}
	if o.CASecret.Name == "" || o.CASecret.Namespace == "" {
		return nil, errors.New("csrsigner: CA Secret is required")
	}
	if o.Clock == nil {
		o.Clock = pki.RealClock
	}
	rec := mgr.GetEventRecorder("hookwright-signer")
	t := &TrustBundles{client: mgr.GetClient(), recorder: rec, signerName: o.SignerName, caKey: o.CASecret, clock: o.Clock}
	if err := t.setup(mgr); err != nil {
		return nil, err
	}
	s := &signer{client: mgr.GetClient(), api: mgr.GetAPIReader(), recorder: rec, o: o, trust: t}
	ours := predicate.NewPredicateFuncs(func(obj client.Object) bool {
		csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
		return ok && csr.Spec.SignerName == o.SignerName
	})
	isCA := predicate.NewPredicateFuncs(func(obj client.Object) bool {
		return obj.GetNamespace() == o.CASecret.Namespace && obj.GetName() == o.CASecret.Name
	})
	// A CA change (first CA, promotion) retries the CSRs still waiting.
	pending := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var l certificatesv1.CertificateSigningRequestList
		if err := mgr.GetClient().List(ctx, &l); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, c := range l.Items {
			if c.Spec.SignerName == o.SignerName && len(c.Status.Certificate) == 0 {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: c.Name}})
			}
		}
		return out
	})
	err := ctrl.NewControllerManagedBy(mgr).Named("csrsigner").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(ours)).
		Watches(&corev1.Secret{}, pending, builder.WithPredicates(isCA)).
		Complete(s)
	return t, err
}

// condition returns the status of the CSR condition typ.
func condition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// Reconcile signs or refuses one approved CSR.
func (s *signer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := s.client.Get(ctx, req.NamespacedName, csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != s.o.SignerName || len(csr.Status.Certificate) > 0 ||
		!condition(csr, certificatesv1.CertificateApproved) ||
		condition(csr, certificatesv1.CertificateDenied) || condition(csr, certificatesv1.CertificateFailed) {
		return reconcile.Result{}, nil
	}
	logger := log.FromContext(ctx).WithValues("csr", csr.Name)
	now := s.o.Clock.Now()
	ca, err := s.activeCA(ctx, now)
	if err != nil {
		logger.Info("approved CSR waits for a signing CA", "reason", err.Error())
		return reconcile.Result{RequeueAfter: waitPoll}, nil
	}
	// The overlap rule: a certificate is only issued by a CA that trust
	// consumers can already see, so a caBundle copied from the
	// ClusterTrustBundle verifies it from the moment it exists.
	if !s.trust.publishes(ca.Cert) {
		logger.V(1).Info("approved CSR waits for its CA in the ClusterTrustBundle", "ca", ca.Cert.Subject.CommonName)
		return reconcile.Result{RequeueAfter: waitPoll}, nil
	}
	p, err := s.policy(ctx, csr)
	if err != nil {
		return reconcile.Result{}, err
	}
	grant, err := csrsign.Check(p, csrsign.Request{PEM: csr.Spec.Request, Usages: csr.Spec.Usages, ExpirationSeconds: csr.Spec.ExpirationSeconds})
	var refusal *csrsign.Refusal
	if errors.As(err, &refusal) {
		return reconcile.Result{}, s.fail(ctx, csr, refusal.Reason, refusal.Message)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	certPEM, err := csrsign.Sign(ca, grant, now, nil)
	if err != nil {
		return reconcile.Result{}, s.fail(ctx, csr, "SigningFailed", err.Error())
	}
	csr.Status.Certificate = certPEM
	if err := s.client.Status().Update(ctx, csr); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{Requeue: true}, nil
		}
		return reconcile.Result{}, fmt.Errorf("write certificate of CSR %s: %w", csr.Name, err)
	}
	s.recorder.Eventf(csr, nil, corev1.EventTypeNormal, eventSigned, "Sign", "signed by %s for %s, valid %s",
		ca.Cert.Subject.CommonName, strings.Join(grant.DNSNames, ","), grant.Validity)
	logger.Info("CSR signed", "names", grant.DNSNames, "ca", ca.Cert.Subject.CommonName)
	return reconcile.Result{}, nil
}

// activeCA is the installation's signing CA, read from the API server (a
// just-promoted CA must not be missed because of a stale cache).
func (s *signer) activeCA(ctx context.Context, now time.Time) (*pki.KeyPair, error) {
	sec := &corev1.Secret{}
	if err := s.api.Get(ctx, s.o.CASecret, sec); err != nil {
		return nil, err
	}
	set := pki.ParseCASecret(sec.Data, now)
	if set.Active == nil {
		return nil, fmt.Errorf("CA Secret %s has no usable active CA", s.o.CASecret)
	}
	return set.Active, nil
}

// policy is csrsign.Policy with the Services the request names, read from
// the API server in allowed namespaces only.
func (s *signer) policy(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (csrsign.Policy, error) {
	p := csrsign.Policy{Namespaces: s.o.Namespaces, ClusterDomain: s.o.ClusterDomain, MaxValidity: s.o.MaxValidity, Services: map[string]csrsign.Service{}}
	for _, key := range csrsign.ServiceKeys(csr.Spec.Request, s.o.ClusterDomain) {
		ns, name, _ := strings.Cut(key, "/")
		if !p.AllowsNamespace(ns) {
			continue
		}
		svc := &corev1.Service{}
		err := s.api.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return p, err
		}
		var ips []netip.Addr
		for _, ip := range svc.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				ips = append(ips, a)
			}
		}
		p.Services[key] = csrsign.Service{ClusterIPs: ips}
	}
	return p, nil
}

// fail marks the CSR Failed with reason and records a Warning event.
func (s *signer) fail(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, reason, msg string) error {
	now := metav1.Now()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: reason,
		Message: "signer " + s.o.SignerName + " refuses: " + msg, LastUpdateTime: now, LastTransitionTime: now,
	})
	if err := s.client.Status().Update(ctx, csr); err != nil {
		return fmt.Errorf("mark CSR %s failed: %w", csr.Name, err)
	}
	s.recorder.Eventf(csr, nil, corev1.EventTypeWarning, EventSigningRefused, "Sign", "%s: %s", reason, msg)
	log.FromContext(ctx).Info("CSR refused", "csr", csr.Name, "reason", reason, "message", msg)
	return nil
}
