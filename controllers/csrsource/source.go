// Package csrsource is the I/O shell of certificate mode CSR
// (internal/csrmode plans it): it reads the serving Secret, the CR's
// CertificateSigningRequests, the signer's ClusterTrustBundles and the
// published caBundle, and performs the plan: a key in a Secret next to the
// serving Secret, a CSR for the Service DNS names with server auth usage,
// its approval when spec.certificate.csr.approve is set, the issued chain
// into the serving Secret once the caBundle trusts it, and deletion of the
// CSRs it replaced.
package csrsource

import (
	"context"
	"fmt"
	"maps"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers/csrsigner"
	"github.com/hookwright/hookwright/internal/certs"
	"github.com/hookwright/hookwright/internal/csrmode"
)

// Approving its own requests (spec.certificate.csr.approve) is an update
// of the approval subresource plus approve on the signer
// (plugin/pkg/admission/certificates/approval); for another signerName
// grant approve on signers/<that name> as well.
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=approve,resourceNames=hookwright.io/webhook-serving

// Labels and annotations of mode CSR.
const (
	// LabelOwner on a CSR is the UID of the CR it was made for.
	LabelOwner = "admission.hookwright.io/csr-owner"
	// AnnotationHash on a CSR and the serving Secret is the csrmode.Spec.Hash
	// of the request.
	AnnotationHash = "admission.hookwright.io/csr-hash"
	// AnnotationCSR on the serving Secret names the CSR of its certificate.
	AnnotationCSR = "admission.hookwright.io/csr"
	// AnnotationDrainingCAs and AnnotationDrainingUntil on the serving
	// Secret keep the CAs of a replaced certificate in the caBundle.
	AnnotationDrainingCAs   = "admission.hookwright.io/csr-draining-cas"
	AnnotationDrainingUntil = "admission.hookwright.io/csr-draining-until"
	// AnnotationRenewed on the serving Secret is the renew-now token
	// (v1alpha1.AnnotationRenewCertificate) its certificate answers.
	AnnotationRenewed = "admission.hookwright.io/renewed-for"
	// ApprovalReason is the reason of the Approved condition the operator sets.
	ApprovalReason = "HookwrightAutoApproved"
	// ReasonWaitingForService: no CSR before the Service it names exists.
	ReasonWaitingForService = "WaitingForService"
)

// Source runs mode CSR for one CR at a time.
type Source struct {
	// Client reads webhook configurations and ClusterTrustBundles (cached)
	// and writes; API reads Secrets and CSRs uncached, so a request just
	// created is never created twice.
	Client    client.Client
	API       client.Reader
	Clientset kubernetes.Interface
	Scheme    *runtime.Scheme
	// Trust is the operator's signer's publisher; nil when the signer is off.
	Trust *csrsigner.TrustBundles
	// TrustAPI reports whether ClusterTrustBundles are served (a
	// csrsigner.DetectTrustBundleAPI result), used when Trust is nil.
	TrustAPI func() (bool, string)
	// OwnSigner is the operator's signerName and CASecret the installation
	// CA: where ClusterTrustBundles are absent, trust for the own signer is
	// read from the CA Secret instead.
	OwnSigner string
	CASecret  types.NamespacedName
	Clock     certs.Clock
	// DrainGrace, SignerWait and RenewFraction tune csrmode.Input.
	DrainGrace    time.Duration
	SignerWait    time.Duration
	RenewFraction float64
}

// Target is one CR's server in mode CSR.
type Target struct {
	// Owner is the CR: controller of the CSRs and Secrets.
	Owner client.Object
	// Labels go on the Secrets (the cache holds only labelled ones).
	Labels map[string]string
	// Namespace and SecretName of the serving Secret; the pending key is in
	// SecretName+"-csr-key". CSRs are named Base+"-<random>".
	Namespace, SecretName, Base string
	// WebhookConfig is the MutatingWebhookConfiguration whose caBundle is
	// read back; Service is the server's Service the DNS names are for.
	WebhookConfig, Service string
	DNSNames               []string
	CSR                    v1alpha1.CSRCertificate
	// RenewToken is the CR's v1alpha1.AnnotationRenewCertificate value.
	RenewToken string
}

// PendingSecretName is the Secret holding the key of a request in progress.
func (t Target) PendingSecretName() string { return t.SecretName + "-csr-key" }

// Result is the certificate side of the CR's state.
type Result struct {
	Ready           bool
	Reason, Message string
	// CABundle for the webhook configuration (nil: none usable yet).
	CABundle []byte
	// Warning is an event to record when the condition reason changes.
	Warning string
	// Owned are the Secrets of mode CSR that exist now (keep them).
	Owned []client.Object
	// Issued is true when a certificate was put into the serving Secret now.
	Issued   bool
	NotAfter time.Time
	// RequeueAfter is when to look again without an event.
	RequeueAfter time.Duration
}

// maxSteps bounds the actions of one reconcile (key, CSR, approval,
// serve, deletions: five at most in practice).
const maxSteps = 8

// Reconcile advances mode CSR for t as far as it can without waiting.
func (s *Source) Reconcile(ctx context.Context, t Target) (Result, error) {
	spec := csrmode.Spec{SignerName: t.CSR.SignerName, Approve: t.CSR.Approve, ExpirationSeconds: t.CSR.ExpirationSeconds, DNSNames: t.DNSNames}
	for range maxSteps {
		in, obs, err := s.observe(ctx, t, spec)
		if err != nil {
			return Result{}, err
		}
		p := csrmode.Compute(in)
		if obs.trustNote != "" {
			p.Message += "; " + obs.trustNote
		}
		res := Result{Ready: p.Ready, Reason: p.Reason, Message: p.Message, CABundle: p.CABundle, Warning: p.Warning, RequeueAfter: p.RequeueAfter, Owned: obs.owned()}
		if obs.trustFatal != "" && len(in.Trust) == 0 {
			res.Reason, res.Message = "ClusterTrustBundleUnavailable", obs.trustFatal
		}
		if leaf, err := certs.ParseCertPEM(in.Serving.Cert); err == nil && p.Ready {
			res.NotAfter = leaf.NotAfter
		}
		for _, name := range p.Delete {
			if err := s.deleteCSR(ctx, obs.csrs[name]); err != nil {
				return res, err
			}
		}
		switch {
		case p.NeedKey:
			key, err := csrmode.NewKey()
			if err != nil {
				return res, err
			}
			if err := s.writeSecret(ctx, t, obs.pending, t.PendingSecretName(), corev1.SecretTypeOpaque, map[string][]byte{corev1.TLSPrivateKeyKey: key}, nil); err != nil {
				return res, err
			}
		case p.Create != nil:
			// A signer checks the names against the Service: request once
			// it exists (the Service's event brings the CR back).
			if err := s.API.Get(ctx, client.ObjectKey{Namespace: t.Namespace, Name: t.Service}, &corev1.Service{}); apierrors.IsNotFound(err) {
				res.Reason, res.Message = ReasonWaitingForService, fmt.Sprintf("Service %s/%s does not exist yet; requesting once it does", t.Namespace, t.Service)
				res.RequeueAfter = time.Second
				return res, nil
			} else if err != nil {
				return res, err
			}
			if err := s.createCSR(ctx, t, *p.Create, in.PendingKey); err != nil {
				return res, err
			}
		case p.Approve != "":
			if err := s.approve(ctx, p.Approve); err != nil {
				return res, err
			}
		case p.Serve != nil:
			ann := map[string]string{AnnotationHash: p.Serve.Hash, AnnotationCSR: p.Serve.CSR}
			if t.RenewToken != "" {
				ann[AnnotationRenewed] = t.RenewToken
			}
			if len(p.DrainingCAs) > 0 {
				ann[AnnotationDrainingCAs] = string(p.DrainingCAs)
				ann[AnnotationDrainingUntil] = p.DrainingUntil.UTC().Format(time.RFC3339)
			}
			data := map[string][]byte{corev1.TLSCertKey: p.Serve.Cert, corev1.TLSPrivateKeyKey: p.Serve.Key, "ca.crt": p.Serve.CA}
			if err := s.writeSecret(ctx, t, obs.serving, t.SecretName, corev1.SecretTypeTLS, data, ann); err != nil {
				return res, err
			}
			if obs.pending != nil {
				if err := s.Client.Delete(ctx, obs.pending, client.Preconditions{UID: &obs.pending.UID}); client.IgnoreNotFound(err) != nil {
					return res, err
				}
			}
			log.FromContext(ctx).Info("CSR certificate served", "csr", p.Serve.CSR, "secret", t.Namespace+"/"+t.SecretName)
			res2, err := s.settle(ctx, t, spec)
			res2.Issued = true
			return res2, err
		default:
			if obs.serving != nil && p.Ready {
				// Keep the Secret as planned (drift: edited by hand).
				if err := s.repairServing(ctx, t, obs.serving); err != nil {
					return res, err
				}
			}
			return res, nil
		}
	}
	return Result{}, fmt.Errorf("mode CSR: no steady state after %d steps", maxSteps)
}

// settle plans once more after serving, for the deletions and the result.
func (s *Source) settle(ctx context.Context, t Target, spec csrmode.Spec) (Result, error) {
	in, obs, err := s.observe(ctx, t, spec)
	if err != nil {
		return Result{}, err
	}
	p := csrmode.Compute(in)
	for _, name := range p.Delete {
		if err := s.deleteCSR(ctx, obs.csrs[name]); err != nil {
			return Result{}, err
		}
	}
	res := Result{Ready: p.Ready, Reason: p.Reason, Message: p.Message, CABundle: p.CABundle, RequeueAfter: p.RequeueAfter, Owned: obs.owned()}
	if obs.trustNote != "" {
		res.Message += "; " + obs.trustNote
	}
	if leaf, err := certs.ParseCertPEM(in.Serving.Cert); err == nil {
		res.NotAfter = leaf.NotAfter
	}
	return res, nil
}

type observed struct {
	serving, pending      *corev1.Secret
	csrs                  map[string]*certificatesv1.CertificateSigningRequest
	trustNote, trustFatal string
}

func (o observed) owned() []client.Object {
	var out []client.Object
	for _, s := range []*corev1.Secret{o.serving, o.pending} {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

func (s *Source) observe(ctx context.Context, t Target, spec csrmode.Spec) (csrmode.Input, observed, error) {
	now := s.Clock.Now()
	in := csrmode.Input{Now: now, Spec: spec, RenewFraction: s.RenewFraction, DrainGrace: s.DrainGrace, SignerWait: s.SignerWait}
	obs := observed{csrs: map[string]*certificatesv1.CertificateSigningRequest{}}
	var err error
	if obs.serving, err = s.getSecret(ctx, t.Namespace, t.SecretName); err != nil {
		return in, obs, err
	}
	if obs.pending, err = s.getSecret(ctx, t.Namespace, t.PendingSecretName()); err != nil {
		return in, obs, err
	}
	if sec := obs.serving; sec != nil {
		in.Serving = csrmode.Serving{Cert: sec.Data[corev1.TLSCertKey], Key: sec.Data[corev1.TLSPrivateKeyKey], CA: sec.Data["ca.crt"],
			Hash: sec.Annotations[AnnotationHash], CSR: sec.Annotations[AnnotationCSR]}
		if until, err := time.Parse(time.RFC3339, sec.Annotations[AnnotationDrainingUntil]); err == nil {
			in.DrainingCAs, in.DrainingUntil = []byte(sec.Annotations[AnnotationDrainingCAs]), until
		}
		in.RenewRequested = t.RenewToken != "" && sec.Annotations[AnnotationRenewed] != t.RenewToken
	}
	if obs.pending != nil {
		in.PendingKey = obs.pending.Data[corev1.TLSPrivateKeyKey]
	}
	var list certificatesv1.CertificateSigningRequestList
	if err := s.API.List(ctx, &list, client.MatchingLabels{LabelOwner: string(t.Owner.GetUID())}); err != nil {
		return in, obs, err
	}
	for i := range list.Items {
		c := &list.Items[i]
		obs.csrs[c.Name] = c
		in.CSRs = append(in.CSRs, csrOf(c))
	}
	if in.Trust, obs.trustNote, obs.trustFatal, err = s.trust(ctx, t.CSR.SignerName, now); err != nil {
		return in, obs, err
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	switch err := s.Client.Get(ctx, client.ObjectKey{Name: t.WebhookConfig}, mwc); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return in, obs, err
	default:
		in.PublishedExists = true
		if len(mwc.Webhooks) > 0 {
			in.Published = mwc.Webhooks[0].ClientConfig.CABundle
		}
	}
	return in, obs, nil
}

func csrOf(c *certificatesv1.CertificateSigningRequest) csrmode.CSR {
	out := csrmode.CSR{Name: c.Name, Created: c.CreationTimestamp.Time, Hash: c.Annotations[AnnotationHash], Request: c.Spec.Request, Certificate: c.Status.Certificate}
	for _, cond := range c.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			continue
		}
		switch cond.Type {
		case certificatesv1.CertificateApproved:
			out.Approved = true
			out.ApprovedAt = cond.LastUpdateTime.Time
			if out.ApprovedAt.IsZero() {
				out.ApprovedAt = cond.LastTransitionTime.Time
			}
		case certificatesv1.CertificateDenied:
			out.Denied, out.Reason, out.Message = true, cond.Reason, cond.Message
		case certificatesv1.CertificateFailed:
			out.Failed, out.Reason, out.Message = true, cond.Reason, cond.Message
		}
	}
	return out
}

// trust is the union of the signer's ClusterTrustBundles. Where the API
// is absent, the own signer's trust is the installation CA (note says so);
// another signer's is unknown (fatal says why).
func (s *Source) trust(ctx context.Context, signer string, now time.Time) (bundle []byte, note, fatal string, err error) {
	ok, why := true, ""
	switch {
	case s.Trust != nil:
		ok, why = s.Trust.Available()
	case s.TrustAPI != nil:
		ok, why = s.TrustAPI()
	}
	if ok {
		var list certificatesv1.ClusterTrustBundleList
		if err := s.Client.List(ctx, &list); err != nil {
			return nil, "", "", err
		}
		var all [][]byte
		for _, b := range list.Items {
			if b.Spec.SignerName == signer {
				all = append(all, []byte(b.Spec.TrustBundle))
			}
		}
		merged, _ := certs.MergeBundlesPEM(all, certs.BundleOptions{Now: now, Max: -1, CAOnly: true})
		return merged, "", "", nil
	}
	if signer != s.OwnSigner || s.OwnSigner == "" {
		return nil, "", fmt.Sprintf("no trust for signer %s: %s", signer, why), nil
	}
	sec := &corev1.Secret{}
	if err := s.API.Get(ctx, s.CASecret, sec); err != nil {
		return nil, "", "", client.IgnoreNotFound(err)
	}
	return csrsigner.DesiredTrustBundle(sec.Data, now), "ClusterTrustBundleUnavailable: trusting the installation CA directly (" + why + ")", "", nil
}

func (s *Source) getSecret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	switch err := s.API.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sec); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return sec, nil
}

// writeSecret creates or updates (optimistic lock) a Secret controlled by
// the CR with exactly data and, for the given keys, annotations.
func (s *Source) writeSecret(ctx context.Context, t Target, live *corev1.Secret, name string, typ corev1.SecretType, data map[string][]byte, ann map[string]string) error {
	if live != nil && live.Type != typ {
		// Type is immutable (a former mode's Secret): replace it.
		if err := s.Client.Delete(ctx, live, client.Preconditions{UID: &live.UID}); client.IgnoreNotFound(err) != nil {
			return err
		}
		live = nil
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: t.Namespace, Name: name}, Type: typ}
	if live != nil {
		sec = live.DeepCopy()
	}
	if sec.Labels == nil {
		sec.Labels = map[string]string{}
	}
	maps.Copy(sec.Labels, t.Labels)
	for _, k := range []string{AnnotationHash, AnnotationCSR, AnnotationDrainingCAs, AnnotationDrainingUntil, AnnotationRenewed} {
		delete(sec.Annotations, k)
	}
	if len(ann) > 0 && sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	maps.Copy(sec.Annotations, ann)
	sec.Data = data
	if err := controllerutil.SetControllerReference(t.Owner, sec, s.Scheme); err != nil {
		return err
	}
	if live == nil {
		if err := s.Client.Create(ctx, sec); err != nil {
			return fmt.Errorf("create Secret %s/%s: %w", t.Namespace, name, err)
		}
		return nil
	}
	if err := s.Client.Update(ctx, sec); err != nil {
		return fmt.Errorf("update Secret %s/%s: %w", t.Namespace, name, err)
	}
	return nil
}

// repairServing restores labels and owner of the serving Secret if they
// were edited (its data is what Compute read and judged usable).
func (s *Source) repairServing(ctx context.Context, t Target, live *corev1.Secret) error {
	ok := metav1.IsControlledBy(live, t.Owner)
	for k, v := range t.Labels {
		ok = ok && live.Labels[k] == v
	}
	if ok {
		return nil
	}
	return s.writeSecret(ctx, t, live, live.Name, live.Type, live.Data, pick(live.Annotations))
}

func pick(ann map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range []string{AnnotationHash, AnnotationCSR, AnnotationDrainingCAs, AnnotationDrainingUntil, AnnotationRenewed} {
		if v, ok := ann[k]; ok {
			out[k] = v
		}
	}
	return out
}

func (s *Source) createCSR(ctx context.Context, t Target, c csrmode.CreateCSR, keyPEM []byte) error {
	req, err := csrmode.BuildRequest(c, keyPEM)
	if err != nil {
		return err
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: t.Base + "-",
			Labels:       map[string]string{LabelOwner: string(t.Owner.GetUID())},
			Annotations:  map[string]string{AnnotationHash: c.Hash},
		},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: req, SignerName: c.SignerName, Usages: c.Usages, ExpirationSeconds: c.ExpirationSeconds,
		},
	}
	maps.Copy(csr.Labels, t.Labels)
	if err := controllerutil.SetControllerReference(t.Owner, csr, s.Scheme); err != nil {
		return err
	}
	if err := s.Client.Create(ctx, csr); err != nil {
		return fmt.Errorf("create CertificateSigningRequest for %s: %w", t.Base, err)
	}
	log.FromContext(ctx).Info("CertificateSigningRequest created", "csr", csr.Name, "signer", c.SignerName, "names", c.DNSNames)
	return nil
}

func (s *Source) approve(ctx context.Context, name string) error {
	csrs := s.Clientset.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: ApprovalReason,
		Message: "approved by hookwright (spec.certificate.csr.approve)", LastUpdateTime: now, LastTransitionTime: now,
	})
	if _, err := csrs.UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("approve CertificateSigningRequest %s: %w", name, err)
	}
	return nil
}

func (s *Source) deleteCSR(ctx context.Context, c *certificatesv1.CertificateSigningRequest) error {
	if c == nil {
		return nil
	}
	if err := s.Client.Delete(ctx, c, client.Preconditions{UID: &c.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete CertificateSigningRequest %s: %w", c.Name, err)
	}
	return nil
}
