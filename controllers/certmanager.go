package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	operatorsv2 "github.com/operator-framework/api/pkg/operators/v2"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hookwright/hookwright/internal/certs"
)

// In mode CertManager the operator owns a cert-manager Certificate (and a
// self-signed Issuer when the CR names none) in the server namespace.
// +kubebuilder:rbac:groups=cert-manager.io,namespace=system,resources=certificates;issuers,verbs=get;list;watch;create;patch;delete

// CertificateReady reasons of mode CertManager.
const (
	// ReasonCertManagerNotInstalled: the API server does not serve
	// cert-manager.io/v1 Certificates (cert-manager's CRDs are missing).
	ReasonCertManagerNotInstalled = "CertManagerNotInstalled"
	// ReasonCertificatePending: the Certificate has no Ready condition yet,
	// or its Secret is not there yet.
	ReasonCertificatePending = "CertificatePending"
	// ReasonCertificateNotReady: cert-manager reports Ready=False.
	ReasonCertificateNotReady = "CertificateNotReady"
)

// certManagerRecheck is how often the operator looks again for
// cert-manager's CRDs while they are missing: slow enough not to loop hot,
// quick enough that installing cert-manager is noticed soon.
const certManagerRecheck = 30 * time.Second

// CertManagerGroupKind is the cert-manager Certificate kind, whose presence
// in discovery means cert-manager's CRDs are installed.
var CertManagerGroupKind = schema.GroupKind{Group: cmapi.SchemeGroupVersion.Group, Kind: cmapi.CertificateKind}

// AddToScheme registers the third-party kinds the controllers read and
// write (cert-manager's Certificate and Issuer, OLM's OperatorCondition) on top of client-go's and
// hookwright's.
func AddToScheme(s *runtime.Scheme) error {
	if err := cmapi.AddToScheme(s); err != nil {
		return err
	}
	return operatorsv2.AddToScheme(s)
}

// CertManagerSecretName is the Secret cert-manager writes for op's
// Certificate and the server mounts: "<base>-cm-tls", distinct from the
// SelfSigned "<base>-tls" so a mode switch never has the operator prune a
// Secret cert-manager is writing.
func CertManagerSecretName(op Operand) string {
	return op.Kind.BaseName(op.Object.GetName()) + "-cm-tls"
}

// CertManagerIssuer is the Issuer the operator creates when
// spec.certificate.issuerRef is empty: a cert-manager SelfSigned Issuer
// named after op in the server namespace (the serving certificate is then
// its own CA, so ca.crt is the certificate). Nil when the CR names one.
func CertManagerIssuer(op Operand, s Settings) *cmapi.Issuer {
	if op.Certificate.IssuerRef != nil {
		return nil
	}
	return &cmapi.Issuer{
		ObjectMeta: meta(op, op.Kind.BaseName(op.Object.GetName()), ServerNamespace(op, s)),
		Spec:       cmapi.IssuerSpec{IssuerConfig: cmapi.IssuerConfig{SelfSigned: &cmapi.SelfSignedIssuer{}}},
	}
}

// CertManagerCertificate is the cert-manager Certificate of op's server:
// the Service DNS names ("<svc>.<ns>.svc" and ".svc.cluster.local"), an
// ECDSA P-256 key regenerated on every issuance, server auth usage, written
// to CertManagerSecretName in the server namespace, issued by the CR's
// issuerRef or by CertManagerIssuer.
func CertManagerCertificate(op Operand, s Settings) *cmapi.Certificate {
	base, ns := op.Kind.BaseName(op.Object.GetName()), ServerNamespace(op, s)
	ref := cmmeta.IssuerReference{Name: base, Kind: cmapi.IssuerKind, Group: cmapi.SchemeGroupVersion.Group}
	if r := op.Certificate.IssuerRef; r != nil {
		ref = cmmeta.IssuerReference{Name: r.Name, Kind: or(r.Kind, cmapi.IssuerKind), Group: or(r.Group, cmapi.SchemeGroupVersion.Group)}
	}
	return &cmapi.Certificate{
		ObjectMeta: meta(op, base, ns),
		Spec: cmapi.CertificateSpec{
			SecretName: CertManagerSecretName(op),
			DNSNames:   certs.ServingDNSNames(base, ns, ""),
			IssuerRef:  ref,
			Usages:     []cmapi.KeyUsage{cmapi.UsageDigitalSignature, cmapi.UsageKeyEncipherment, cmapi.UsageServerAuth},
			PrivateKey: &cmapi.CertificatePrivateKey{
				Algorithm: cmapi.ECDSAKeyAlgorithm, Size: 256, RotationPolicy: cmapi.RotationPolicyAlways,
			},
		},
	}
}

// CertManagerState is CertificateReady and the caBundle in mode
// CertManager, from the live Certificate and its Secret (either nil when
// missing). The caBundle is the Secret's ca.crt whenever its tls.crt
// verifies for "<svc>.<ns>.svc" against it at now, as the API server will
// check it, even while cert-manager reports a failed renewal (the current
// certificate still serves); Ready also needs cert-manager's Ready=True.
// NotAfter and RenewAt come from the Certificate's status.
func CertManagerState(op Operand, s Settings, crt *cmapi.Certificate, secret *corev1.Secret, now time.Time) CertState {
	ns, name := ServerNamespace(op, s), op.Kind.BaseName(op.Object.GetName())
	if crt == nil {
		return CertState{Reason: ReasonCertificatePending, Message: fmt.Sprintf("cert-manager Certificate %s/%s not created yet", ns, name)}
	}
	var ready *cmapi.CertificateCondition
	for i := range crt.Status.Conditions {
		if crt.Status.Conditions[i].Type == cmapi.CertificateConditionReady {
			ready = &crt.Status.Conditions[i]
		}
	}
	st := CertState{}
	if crt.Status.NotAfter != nil {
		st.NotAfter = crt.Status.NotAfter.Time
	}
	if crt.Status.RenewalTime != nil {
		st.RenewAt = crt.Status.RenewalTime.Time
	}
	secretName := crt.Spec.SecretName
	var verr error
	switch {
	case secret == nil:
		verr = fmt.Errorf("Secret %s/%s not found", ns, secretName)
	case len(secret.Data[SecretKeyCA]) == 0:
		verr = fmt.Errorf("Secret %s/%s has no ca.crt (the issuer must provide one for the caBundle)", ns, secretName)
	default:
		kp, err := certs.ParseKeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
		if err != nil {
			verr = fmt.Errorf("Secret %s/%s: %w", ns, secretName, err)
			break
		}
		host := certs.ServingDNSNames(name, ns, "")[0]
		if err := certs.VerifyServing(kp.Cert, secret.Data[SecretKeyCA], host, now); err != nil {
			verr = fmt.Errorf("Secret %s/%s: tls.crt does not verify for %s against ca.crt: %w", ns, secretName, host, err)
			break
		}
		st.CABundle = secret.Data[SecretKeyCA]
		if st.NotAfter.IsZero() {
			st.NotAfter = kp.Cert.NotAfter
		}
	}
	switch {
	case ready == nil:
		st.Reason, st.Message = ReasonCertificatePending, fmt.Sprintf("waiting for cert-manager to issue Certificate %s/%s", ns, name)
	case ready.Status != cmmeta.ConditionTrue:
		st.Reason, st.Message = ReasonCertificateNotReady, fmt.Sprintf("cert-manager Certificate %s/%s is not Ready (%s): %s", ns, name, ready.Reason, ready.Message)
	case verr != nil:
		st.Reason, st.Message = ReasonSecretInvalid, fmt.Sprintf("cert-manager Certificate %s/%s is Ready but %v", ns, name, verr)
		if secret == nil {
			st.Reason = ReasonCertificatePending
		}
	default:
		st.Ready, st.Reason = true, ReasonValid
		st.Message = fmt.Sprintf("cert-manager Certificate %s/%s (%s %s) ready, valid until %s",
			ns, name, crt.Spec.IssuerRef.Kind, crt.Spec.IssuerRef.Name, fmtTime(st.NotAfter))
		if !st.RenewAt.IsZero() {
			st.Message += ", renewal at " + fmtTime(st.RenewAt)
		}
	}
	return st
}

// certManagerWatch adds the watch on owned cert-manager Certificates to a
// running controller once their CRD is served: a watch registered at start
// would fail the manager on a cluster without cert-manager.
type certManagerWatch struct {
	mu      sync.Mutex
	done    bool
	ctrl    controller.Controller
	cache   cache.Cache
	mapper  apimeta.RESTMapper
	scheme  *runtime.Scheme
	owner   client.Object
	started bool // ctrl is set (SetupWithManager ran)
}

// ensure starts the watch if it is not running yet.
func (w *certManagerWatch) ensure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || !w.started {
		return nil
	}
	h := handler.TypedEnqueueRequestForOwner[*cmapi.Certificate](w.scheme, w.mapper, w.owner, handler.OnlyControllerOwner())
	if err := w.ctrl.Watch(source.Kind(w.cache, &cmapi.Certificate{}, h)); err != nil {
		return err
	}
	w.done = true
	return nil
}

// running reports whether the watch was started.
func (w *certManagerWatch) running() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done
}

// certManagerInstalled reports whether the API server serves
// cert-manager.io/v1 Certificates (the manager's RESTMapper re-reads
// discovery for a group it has not seen).
func (r *Reconciler) certManagerInstalled() (bool, error) {
	_, err := r.Client.RESTMapper().RESTMapping(CertManagerGroupKind, cmapi.SchemeGroupVersion.Version)
	switch {
	case err == nil:
		return true, nil
	case apimeta.IsNoMatchError(err):
		return false, nil
	}
	return false, err
}

// certManager applies op's Issuer and Certificate and reads their state.
// Without cert-manager's CRDs it returns a CertState saying so and asks to
// be called again after certManagerRecheck.
func (r *Reconciler) certManager(ctx context.Context, op Operand, now time.Time) (CertState, time.Duration, error) {
	ok, err := r.certManagerInstalled()
	if err != nil {
		return CertState{}, 0, err
	}
	if !ok {
		return CertState{Reason: ReasonCertManagerNotInstalled, Message: fmt.Sprintf(
			"certificate mode CertManager: the API server does not serve %s/%s %s; install cert-manager (checking again every %s)",
			CertManagerGroupKind.Group, cmapi.SchemeGroupVersion.Version, CertManagerGroupKind.Kind, certManagerRecheck)}, certManagerRecheck, nil
	}
	if r.cmWatch != nil {
		if err := r.cmWatch.ensure(); err != nil {
			return CertState{}, 0, fmt.Errorf("watch cert-manager Certificates: %w", err)
		}
	}
	if iss := CertManagerIssuer(op, r.Settings); iss != nil {
		if _, err := r.ensure(ctx, op, iss); err != nil {
			return CertState{}, 0, err
		}
	}
	want := CertManagerCertificate(op, r.Settings)
	if _, err := r.ensure(ctx, op, want); err != nil {
		return CertState{}, 0, err
	}
	crt := &cmapi.Certificate{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), crt); err != nil {
		if !apierrors.IsNotFound(err) {
			return CertState{}, 0, err
		}
		crt = nil
	}
	// cert-manager's Secret carries no operator label, so it is not in the
	// cache: read it directly. A change of it comes with a Certificate
	// status change (revision, notAfter), which re-queues the CR.
	sec := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: want.Namespace, Name: want.Spec.SecretName}, sec); err != nil {
		if !apierrors.IsNotFound(err) {
			return CertState{}, 0, err
		}
		sec = nil
	}
	return CertManagerState(op, r.Settings, crt, sec, now), 0, nil
}

// certManagerOwned are the cert-manager objects op should own (for pruning).
func certManagerOwned(op Operand, s Settings) []client.Object {
	out := []client.Object{CertManagerCertificate(op, s)}
	if iss := CertManagerIssuer(op, s); iss != nil {
		out = append(out, iss)
	}
	return out
}

// InjectedCABundle is the caBundle to keep in the webhook configuration
// when cert-manager's cainjector owns it: a live configuration annotated
// with cert-manager.io/inject-ca-from (or inject-ca-from-secret) keeps its
// non-empty caBundle, so the operator never fights cainjector over it. Nil
// means the operator publishes its own.
func InjectedCABundle(live *admissionregistrationv1.MutatingWebhookConfiguration) []byte {
	if live == nil {
		return nil
	}
	a := live.GetAnnotations()
	if a[cmapi.WantInjectAnnotation] == "" && a[cmapi.WantInjectFromSecretAnnotation] == "" {
		return nil
	}
	if len(live.Webhooks) == 0 || len(live.Webhooks[0].ClientConfig.CABundle) == 0 {
		return nil
	}
	return live.Webhooks[0].ClientConfig.CABundle
}
