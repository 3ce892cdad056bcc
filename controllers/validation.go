package controllers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
)

// The manager serves a validating webhook for its own CRs (package
// cmd/app/validation) and manages its configuration and serving
// certificate with the SelfSigned machinery: the installation CA Secret
// signs it, the configuration's caBundle is the CA Secret's ca.crt (which
// carries a staged CA from the moment it is staged, before it signs) plus
// the --ca-dir bundle, and the certificate is re-issued as soon as the
// active CA changes or two thirds of its life have passed. So `make
// deploy` needs no cert-manager, and an OLM install works the same way.
//
// The configuration cannot stop the operator or anything else from
// starting: its rules are CREATE and UPDATE of the two cluster-scoped CR
// kinds only (no namespaced object, no DELETE, no status), and an object
// being deleted is never matched, so finalizers can always be removed.
// failurePolicy is Fail: an invalid CR must not slip in while the manager
// restarts; the operator itself does not need its webhook to start.
// Patch (server-side apply) only of its own configuration (resourceNames;
// create, list and watch cannot be limited by name).
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=list;watch;create
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;patch,resourceNames=hookwright-validation
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get,resourceNames=sidecarinjectors.admission.hookwright.io;nodeoversells.admission.hookwright.io

// WebhookSettings configure the manager's validating webhook.
type WebhookSettings struct {
	// Service is the Service in the operator namespace, port 443, in front
	// of the manager's webhook server; empty disables the webhook.
	Service string
	// Path the webhook is served on (cmd/app/validation.Path).
	Path string
	// Certs, when set, is given the manager's client so every replica (not
	// only the leader) serves the certificate from desired.ManagerCertSecretName.
	Certs *ServingCertSource
}

// ServingCertSource serves the manager's webhook certificate from the
// desired.ManagerCertSecretName Secret as read through a client (the manager's
// cache, which holds Secrets labelled managed-by=hookwright), parsing it
// again only when its resourceVersion changes. Use GetCertificate as
// tls.Config.GetCertificate.
type ServingCertSource struct {
	key    client.ObjectKey
	reader atomic.Pointer[client.Reader]

	mu   sync.Mutex
	rv   string
	cert *tls.Certificate
}

// NewServingCertSource reads desired.ManagerCertSecretName in namespace once a
// reader is set (SetReader; Setup does it).
func NewServingCertSource(namespace string) *ServingCertSource {
	return &ServingCertSource{key: client.ObjectKey{Namespace: namespace, Name: desired.ManagerCertSecretName}}
}

// setReader sets the client the Secret is read with.
func (s *ServingCertSource) setReader(r client.Reader) { s.reader.Store(&r) }

// GetCertificate returns the current certificate, or an error (the TLS
// handshake fails) while the Secret does not exist or does not parse.
func (s *ServingCertSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	rp := s.reader.Load()
	if rp == nil {
		return nil, errors.New("webhook serving certificate: not set up yet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sec := &corev1.Secret{}
	if err := (*rp).Get(ctx, s.key, sec); err != nil {
		return nil, fmt.Errorf("webhook serving certificate %s: %w", s.key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert != nil && sec.ResourceVersion == s.rv {
		return s.cert, nil
	}
	c, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("webhook serving certificate %s: %w", s.key, err)
	}
	s.cert, s.rv = &c, sec.ResourceVersion
	return s.cert, nil
}

// validationReconciler keeps the manager's serving certificate Secret and
// ValidatingWebhookConfiguration in place (leader only). It reconciles one
// key, on changes of the CA Secret, its Secret, its configuration and the
// --ca-dir bundle, and when the certificate is due for renewal.
type validationReconciler struct {
	Client    client.Client
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Settings  Settings
	shared    *shared
}

func (v *validationReconciler) now() time.Time {
	if c := v.Settings.Certificates.Clock; c != nil {
		return c.Now()
	}
	return time.Now()
}

func (v *validationReconciler) setup(mgr ctrl.Manager) error {
	one := []reconcile.Request{{NamespacedName: client.ObjectKey{Name: desired.ValidatingConfigName}}}
	mine := func(_ context.Context, o client.Object) []reconcile.Request {
		switch {
		case o.GetNamespace() == v.Settings.Namespace && (o.GetName() == desired.CASecretName || o.GetName() == desired.ManagerCertSecretName),
			o.GetNamespace() == "" && o.GetName() == desired.ValidatingConfigName:
			return one
		}
		return nil
	}
	b := ctrl.NewControllerManagedBy(mgr).Named("validation").
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(mine)).
		Watches(&admissionregistrationv1.ValidatingWebhookConfiguration{}, handler.EnqueueRequestsFromMapFunc(mine))
	// One reconcile at start: on a fresh installation neither the CA Secret
	// nor the configuration exists, so no watch event would ever set the
	// webhook up before the first CR (which it must validate) arrives.
	b = b.WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(one[0])
		return nil
	}))
	if v.shared.caDir != nil {
		b = b.WatchesRawSource(source.Channel(v.shared.caDir.subscribe(), handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return one
		})))
	}
	return b.Complete(v)
}

// Reconcile (re)issues the serving certificate when ServingRenewalReason
// says so against the active CA, and applies the configuration when it
// differs. The CA Secret is the CA controller's (sources.CAReconciler):
// until it exists, Reconcile waits.
func (v *validationReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	now := v.now()
	ns := v.Settings.Namespace
	policy := v.Settings.Certificates.Policy
	owners, err := sources.InstallationOwners(ctx, v.APIReader)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(owners) == 0 {
		// The CRDs are being deleted (an uninstall): the configuration,
		// deleted with them, must not come back.
		log.FromContext(ctx).Info("CRDs absent or being deleted; the validating webhook is not set up", "crds", sources.InstallationCRDs)
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}
	caSec := &corev1.Secret{}
	switch err := v.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: desired.CASecretName}, caSec); {
	case apierrors.IsNotFound(err):
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	case err != nil:
		return ctrl.Result{}, err
	}
	caData := caSec.Data
	set := pki.ParseCASecret(caData, now)
	if set.Active == nil {
		// The CA controller repairs the CA Secret.
		log.FromContext(ctx).Info("no usable signing CA yet; waiting", "problems", set.Problems)
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}

	// While a certificate is served, the configuration goes first: a CA
	// that starts signing is in the CA Secret's ca.crt before (the planner
	// publishes it first), so the configuration carries it before a
	// certificate from it is served. The first configuration is written
	// only once the first certificate is in the cache it is served from.
	want := desired.ValidatingWebhookConfiguration(ns, v.Settings.Webhook.Service, v.Settings.Webhook.Path)
	sources.PublishValidating(want, caData, v.shared.caDir.Bundle())
	want.OwnerReferences = owners
	names := pki.ServingDNSNames(v.Settings.Webhook.Service, ns, "")
	cur := &corev1.Secret{}
	key := client.ObjectKey{Namespace: ns, Name: desired.ManagerCertSecretName}
	switch err := v.APIReader.Get(ctx, key, cur); {
	case apierrors.IsNotFound(err):
		cur = nil
	case err != nil:
		return ctrl.Result{}, err
	}
	if cur != nil {
		if err := v.ensure(ctx, want); err != nil {
			return ctrl.Result{}, err
		}
		if err := sources.AddOwners(ctx, v.Client, cur, owners); err != nil {
			return ctrl.Result{}, err
		}
	}
	check := pki.ServingCheck{DNSNames: names, Signer: set.Active.Cert, RenewFraction: policy.ServingRenewFraction, KeyPEM: []byte{}}
	if cur != nil {
		check.CertPEM, check.KeyPEM = cur.Data[corev1.TLSCertKey], cur.Data[corev1.TLSPrivateKeyKey]
		if check.KeyPEM == nil {
			check.KeyPEM = []byte{} // present but empty: checked
		}
	}
	certPEM := check.CertPEM
	if reason, msg := pki.ServingRenewalReason(check, now); reason != "" {
		kp, err := pki.NewServingCert(set.Active, pki.ServingOptions{DNSNames: names, Validity: policy.ServingValidity, Clock: pki.FixedClock(now)})
		if err != nil {
			return ctrl.Result{}, err
		}
		sec := desired.ManagerCertSecret(ns, kp.CertPEM, kp.KeyPEM)
		sec.OwnerReferences = owners
		if err := v.apply(ctx, sec); err != nil {
			return ctrl.Result{}, err
		}
		log.FromContext(ctx).Info("manager webhook certificate issued", "reason", reason, "message", msg, "notAfter", kp.Cert.NotAfter)
		certPEM = kp.CertPEM
	}
	if cur == nil {
		if err := v.waitCached(ctx, key, string(certPEM)); err != nil {
			return ctrl.Result{}, err
		}
		if err := v.ensure(ctx, want); err != nil {
			return ctrl.Result{}, err
		}
	}
	var result ctrl.Result
	if c, err := pki.ParseCertPEM(certPEM); err == nil {
		result.RequeueAfter = max(pki.RenewalTime(c, policy.ServingRenewFraction).Sub(now), time.Second)
	}
	return result, nil
}

// waitCached waits (up to 10 s) until the cache serves the Secret key with
// tls.crt certPEM, so servingCertSource has it before the API server calls.
func (v *validationReconciler) waitCached(ctx context.Context, key client.ObjectKey, certPEM string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		sec := &corev1.Secret{}
		if err := v.Client.Get(ctx, key, sec); err == nil && string(sec.Data[corev1.TLSCertKey]) == certPEM {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("serving certificate %s not in the cache: %w", key, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ensure applies obj when the cached copy lacks any field it sets.
func (v *validationReconciler) ensure(ctx context.Context, obj client.Object) error {
	gvk := admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration")
	want, err := apply.ToApplyObject(obj, gvk)
	if err != nil {
		return err
	}
	live := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	switch err := v.Client.Get(ctx, client.ObjectKeyFromObject(obj), live); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	default:
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
		if err != nil {
			return err
		}
		if len(apply.Drift(want.Object, m)) == 0 {
			return nil
		}
	}
	return v.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(apply.FieldManager), client.ForceOwnership)
}

func (v *validationReconciler) apply(ctx context.Context, obj client.Object) error {
	want, err := apply.ToApplyObject(obj, corev1.SchemeGroupVersion.WithKind("Secret"))
	if err != nil {
		return err
	}
	return v.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(apply.FieldManager), client.ForceOwnership)
}
