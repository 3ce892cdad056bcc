package sources

import (
	"context"
	"fmt"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/csrplan"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
)

// Labels, annotations and reasons of mode CSR.
const (
	// LabelCSROwner on a CSR is the UID of the CR it was made for.
	LabelCSROwner = "admission.hookwright.io/csr-owner"
	// annotationCSRHash on a CSR and the serving Secret is the
	// csrplan.Spec.Hash of the request.
	annotationCSRHash = "admission.hookwright.io/csr-hash"
	// annotationCSR on the serving Secret names the CSR of its certificate.
	annotationCSR = "admission.hookwright.io/csr"
	// annotationCSRDrainingCAs and annotationCSRDrainingUntil on the
	// serving Secret keep the CAs of a replaced certificate in the caBundle.
	annotationCSRDrainingCAs   = "admission.hookwright.io/csr-draining-cas"
	annotationCSRDrainingUntil = "admission.hookwright.io/csr-draining-until"
	// annotationRenewedFor on a serving Secret is the renew-now token
	// (v1alpha1.AnnotationRenewCertificate) its certificate answers.
	annotationRenewedFor = "admission.hookwright.io/renewed-for"
	// CSRApprovalReason is the reason of the Approved condition the operator sets.
	CSRApprovalReason = "HookwrightAutoApproved"
	// reasonWaitingForService: no CSR before the Service it names exists
	// (a signer checks the names against it).
	reasonWaitingForService = "WaitingForService"
	// reasonTrustBundleUnavailable: another signer's trust cannot be read
	// because ClusterTrustBundles are not served.
	reasonTrustBundleUnavailable = "ClusterTrustBundleUnavailable"
	// EventCSR reports a CSR that was denied or failed, or whose signer
	// does not answer (Warning).
	EventCSR = "CertificateSigningRequest"
)

// TrustAPI says whether the API server serves certificates.k8s.io/v1
// ClusterTrustBundle, and why not (csrsigner.TrustBundles, or a
// StaticTrustAPI from csrsigner.DetectTrustBundleAPI).
type TrustAPI interface {
	Available() (bool, string)
}

// StaticTrustAPI is a trustAPI decided once.
type StaticTrustAPI struct {
	OK  bool
	Why string
}

// Available returns OK and Why.
func (s StaticTrustAPI) Available() (bool, string) { return s.OK, s.Why }

// CSRSettings configure mode CSR.
type CSRSettings struct {
	// Trust says whether ClusterTrustBundles are served; nil means they are.
	Trust TrustAPI
	// OwnSigner is the operator's signerName (--csr-signer-name; "" when
	// off): where ClusterTrustBundles are absent its trust is the
	// installation CA, read from the CA Secret.
	OwnSigner string
	// SignerWait is how long an approved CSR may stay unsigned before the
	// condition says the signer does not answer (0: csrplan.DefaultSignerWait).
	SignerWait time.Duration
	// Clientset approves CSRs (the approval subresource).
	Clientset kubernetes.Interface
}

// csrMaxSteps bounds the actions of one reconcile (key, CSR, approval,
// serve: four in practice).
const csrMaxSteps = 8

// csrSource is mode CSR: the serving certificate comes from a
// CertificateSigningRequest for spec.certificate.csr.signerName, its trust
// from that signer's ClusterTrustBundles (internal/certificates/csrplan plans it). Its Secrets
// are applied with apply; its CSRs, cluster-scoped and owned by the CR, are
// created, approved and deleted directly.
type csrSource struct{ env Env }

// Certificate advances mode CSR as far as it can without waiting.
func (c *csrSource) Certificate(ctx context.Context, cr desired.CR, apply Apply) (State, error) {
	var csrSpec v1alpha1.CSRCertificate
	if cr.Certificate.CSR != nil {
		csrSpec = *cr.Certificate.CSR
	}
	ns := desired.ServerNamespace(cr, c.env.Settings)
	spec := csrplan.Spec{SignerName: csrSpec.SignerName, Approve: csrSpec.Approve, ExpirationSeconds: csrSpec.ExpirationSeconds,
		DNSNames: pki.ServingDNSNames(cr.Base(), ns, "")}
	for range csrMaxSteps {
		in, obs, err := c.observe(ctx, cr, spec)
		if err != nil {
			return State{}, err
		}
		p := csrplan.Compute(in)
		// A request replaced by the one about to be served goes once the
		// new certificate is in the Secret, not before: until then it is
		// the record of what is served.
		if p.Serve == nil {
			if err := c.deleteCSRs(ctx, obs, p.Delete); err != nil {
				return State{}, err
			}
		}
		st := State{Ready: p.Ready, Reason: p.Reason, Message: p.Message, CABundle: p.CABundle, Publish: publishAsIs,
			RequeueAfter: p.RequeueAfter, Keep: obs.keep(p.InProgress())}
		if obs.trustNote != "" {
			st.Message += "; " + obs.trustNote
		}
		if obs.trustFatal != "" && len(in.Trust) == 0 && !p.Ready {
			st.Reason, st.Message = reasonTrustBundleUnavailable, obs.trustFatal
		}
		if leaf, err := pki.ParseCertPEM(in.Serving.Cert); err == nil && p.Ready {
			st.NotAfter, st.RenewAt = leaf.NotAfter, pki.RenewalTime(leaf, c.env.Certificates.Policy.ServingRenewFraction)
		}
		switch {
		case p.NeedKey:
			key, err := csrplan.NewKey()
			if err != nil {
				return st, err
			}
			if err := apply(ctx, desired.CSRKeySecret(cr, c.env.Settings, key)); err != nil {
				return st, err
			}
		case p.Create != nil:
			svc := client.ObjectKey{Namespace: ns, Name: cr.Base()}
			if err := c.env.APIReader.Get(ctx, svc, &corev1.Service{}); apierrors.IsNotFound(err) {
				st.Reason, st.Message = reasonWaitingForService, fmt.Sprintf("Service %s does not exist yet; requesting once it does", svc)
				st.RequeueAfter = time.Second
				return st, nil
			} else if err != nil {
				return st, err
			}
			if err := c.createCSR(ctx, cr, *p.Create, in.PendingKey); err != nil {
				return st, err
			}
		case p.Approve != "":
			if err := c.approve(ctx, p.Approve); err != nil {
				return st, err
			}
		case p.Serve != nil:
			sec := desired.ServingSecret(cr, c.env.Settings, p.Serve.Cert, p.Serve.Key, p.Serve.CA)
			sec.Annotations = map[string]string{annotationCSRHash: p.Serve.Hash, annotationCSR: p.Serve.CSR}
			if tok := cr.Object.GetAnnotations()[v1alpha1.AnnotationRenewCertificate]; tok != "" {
				sec.Annotations[annotationRenewedFor] = tok
			}
			if len(p.DrainingCAs) > 0 {
				sec.Annotations[annotationCSRDrainingCAs] = string(p.DrainingCAs)
				sec.Annotations[annotationCSRDrainingUntil] = fmtTime(p.DrainingUntil)
			}
			if err := apply(ctx, sec); err != nil {
				return st, err
			}
			if err := c.deleteCSRs(ctx, obs, p.Delete); err != nil {
				return st, err
			}
			log.FromContext(ctx).Info("CSR certificate served", "csr", p.Serve.CSR, "secret", ns+"/"+sec.Name)
			c.env.Recorder.Eventf(cr.Object, nil, corev1.EventTypeNormal, EventCertificateIssued, "Issue",
				"serving certificate %s/%s issued through CSR %s by signer %s", ns, sec.Name, p.Serve.CSR, spec.SignerName)
		default:
			// A Warning once per reason, when the condition changes to it.
			if cond := apimeta.FindStatusCondition(cr.Conditions(), v1alpha1.ConditionCertificateReady); p.Warning != "" && (cond == nil || cond.Reason != p.Reason) {
				c.env.Recorder.Eventf(cr.Object, nil, corev1.EventTypeWarning, EventCSR, "Request", p.Warning)
			}
			if obs.serving != nil && p.Ready {
				// The served Secret as it should be (drift repair by apply).
				if err := apply(ctx, servingAsIs(cr, c.env.Settings, obs.serving)); err != nil {
					return st, err
				}
			}
			return st, nil
		}
	}
	return State{}, fmt.Errorf("mode CSR: no steady state after %d steps", csrMaxSteps)
}

type csrObserved struct {
	serving, pending      *corev1.Secret
	csrs                  map[string]*certificatesv1.CertificateSigningRequest
	trustNote, trustFatal string
}

// keep is what mode CSR owns now: the serving Secret and, while a
// request is in progress, its key's Secret (pruned after).
func (o csrObserved) keep(inProgress bool) []client.Object {
	var out []client.Object
	if o.serving != nil {
		out = append(out, o.serving)
	}
	if o.pending != nil && inProgress {
		out = append(out, o.pending)
	}
	return out
}

// observe gathers csrplan's input: Secrets and CSRs uncached (a request
// just created is never created twice), trust and the published caBundle
// from the cache.
func (c *csrSource) observe(ctx context.Context, cr desired.CR, spec csrplan.Spec) (csrplan.Input, csrObserved, error) {
	now := c.env.Certificates.Now()
	cs := c.env.CSR
	in := csrplan.Input{Now: now, Spec: spec, RenewFraction: c.env.Certificates.Policy.ServingRenewFraction,
		DrainGrace: c.env.Certificates.Grace(), SignerWait: cs.SignerWait}
	obs := csrObserved{csrs: map[string]*certificatesv1.CertificateSigningRequest{}}
	ns := desired.ServerNamespace(cr, c.env.Settings)
	var err error
	if obs.serving, err = secretOrNil(ctx, c.env.APIReader, client.ObjectKey{Namespace: ns, Name: desired.ServingSecretName(cr)}); err != nil {
		return in, obs, err
	}
	if obs.pending, err = secretOrNil(ctx, c.env.APIReader, client.ObjectKey{Namespace: ns, Name: desired.CSRKeySecretName(cr)}); err != nil {
		return in, obs, err
	}
	if sec := obs.serving; sec != nil {
		in.Serving = csrplan.Serving{Cert: sec.Data[corev1.TLSCertKey], Key: sec.Data[corev1.TLSPrivateKeyKey], CA: sec.Data[desired.SecretKeyCA],
			Hash: sec.Annotations[annotationCSRHash], CSR: sec.Annotations[annotationCSR]}
		if until, err := time.Parse(time.RFC3339, sec.Annotations[annotationCSRDrainingUntil]); err == nil {
			in.DrainingCAs, in.DrainingUntil = []byte(sec.Annotations[annotationCSRDrainingCAs]), until
		}
		tok := cr.Object.GetAnnotations()[v1alpha1.AnnotationRenewCertificate]
		in.RenewRequested = tok != "" && sec.Annotations[annotationRenewedFor] != tok
	}
	if obs.pending != nil {
		in.PendingKey = obs.pending.Data[corev1.TLSPrivateKeyKey]
	}
	var list certificatesv1.CertificateSigningRequestList
	if err := c.env.APIReader.List(ctx, &list, client.MatchingLabels{LabelCSROwner: string(cr.Object.GetUID())}); err != nil {
		return in, obs, err
	}
	for i := range list.Items {
		r := &list.Items[i]
		obs.csrs[r.Name] = r
		in.CSRs = append(in.CSRs, csrInputOf(r))
	}
	if in.Trust, obs.trustNote, obs.trustFatal, err = c.trust(ctx, spec.SignerName, now); err != nil {
		return in, obs, err
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	found, err := getOrNil(ctx, c.env.Client, client.ObjectKey{Name: cr.Base()}, mwc)
	if err != nil {
		return in, obs, err
	}
	if in.PublishedExists = found; found && len(mwc.Webhooks) > 0 {
		in.Published = mwc.Webhooks[0].ClientConfig.CABundle
	}
	return in, obs, nil
}

func csrInputOf(r *certificatesv1.CertificateSigningRequest) csrplan.CSR {
	out := csrplan.CSR{Name: r.Name, Created: r.CreationTimestamp.Time, Hash: r.Annotations[annotationCSRHash], Request: r.Spec.Request, Certificate: r.Status.Certificate}
	for _, cond := range r.Status.Conditions {
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
// is absent the own signer's trust is the installation CA (note says so);
// another signer's is unknown (fatal says why).
func (c *csrSource) trust(ctx context.Context, signer string, now time.Time) (bundle []byte, note, fatal string, err error) {
	ok, why := true, ""
	if c.env.CSR.Trust != nil {
		ok, why = c.env.CSR.Trust.Available()
	}
	if ok {
		var list certificatesv1.ClusterTrustBundleList
		if err := c.env.Client.List(ctx, &list); err != nil {
			return nil, "", "", err
		}
		var all [][]byte
		for _, b := range list.Items {
			if b.Spec.SignerName == signer {
				all = append(all, []byte(b.Spec.TrustBundle))
			}
		}
		merged, _ := pki.MergeBundlesPEM(all, pki.BundleOptions{Now: now, Max: -1, CAOnly: true})
		return merged, "", "", nil
	}
	own := c.env.CSR.OwnSigner
	if signer != own || own == "" {
		return nil, "", fmt.Sprintf("no trust anchors for signer %s: %s", signer, why), nil
	}
	sec, err := secretOrNil(ctx, c.env.APIReader, client.ObjectKey{Namespace: c.env.Settings.Namespace, Name: desired.CASecretName})
	if err != nil || sec == nil {
		return nil, "", "", err
	}
	return pki.TrustAnchors(sec.Data, now), reasonTrustBundleUnavailable + ": trusting the installation CA directly (" + why + ")", "", nil
}

func (c *csrSource) createCSR(ctx context.Context, cr desired.CR, r csrplan.CreateCSR, keyPEM []byte) error {
	req, err := csrplan.BuildRequest(r, keyPEM)
	if err != nil {
		return err
	}
	m := desired.CSRMeta(cr, LabelCSROwner)
	m.Annotations = map[string]string{annotationCSRHash: r.Hash}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: m,
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: req, SignerName: r.SignerName, Usages: r.Usages, ExpirationSeconds: r.ExpirationSeconds,
		},
	}
	if err := c.env.Client.Create(ctx, csr); err != nil {
		return fmt.Errorf("create CertificateSigningRequest for %s: %w", cr.Base(), err)
	}
	log.FromContext(ctx).Info("CertificateSigningRequest created", "csr", csr.Name, "signer", r.SignerName, "names", r.DNSNames)
	return nil
}

func (c *csrSource) approve(ctx context.Context, name string) error {
	if c.env.CSR.Clientset == nil {
		return fmt.Errorf("approve CertificateSigningRequest %s: no clientset", name)
	}
	csrs := c.env.CSR.Clientset.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: CSRApprovalReason,
		Message: "approved by hookwright (spec.certificate.csr.approve)", LastUpdateTime: now, LastTransitionTime: now,
	})
	if _, err := csrs.UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("approve CertificateSigningRequest %s: %w", name, err)
	}
	return nil
}

// deleteCSRs deletes the observed CSRs named.
func (c *csrSource) deleteCSRs(ctx context.Context, obs csrObserved, names []string) error {
	for _, name := range names {
		if err := c.deleteCSR(ctx, obs.csrs[name]); err != nil {
			return err
		}
	}
	return nil
}

func (c *csrSource) deleteCSR(ctx context.Context, r *certificatesv1.CertificateSigningRequest) error {
	if r == nil {
		return nil
	}
	if err := c.env.Client.Delete(ctx, r, client.Preconditions{UID: &r.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete CertificateSigningRequest %s: %w", r.Name, err)
	}
	return nil
}
