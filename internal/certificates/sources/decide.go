package sources

import (
	"errors"
	"fmt"
	"slices"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/requeue"
)

// The pure decisions of the certificate modes: what a mode's state and
// objects are, given what its I/O (selfsigned.go, secret.go,
// certmanager.go, csr.go, owners.go) read. No API calls here.

// selfSignedDecision is cr's SelfSigned state and the serving Secret to
// write (nil: none usable yet).
type selfSignedDecision struct {
	State
	secret      *corev1.Secret
	issueReason string
	steps       []pki.Step
}

// decideSelfSigned turns the planner's outcome into cr's serving Secret and
// CertificateReady. A certificate replaced in this reconcile, and one still
// draining from an earlier replacement, are recorded in the Secret's
// draining annotations until their grace period ends.
func decideSelfSigned(cr desired.CR, s desired.Settings, cs Settings, out outcome, current *corev1.Secret, now time.Time) selfSignedDecision {
	d := selfSignedDecision{steps: out.Steps}
	prefix := describeSteps(out.Steps, out.Last)
	if len(out.Bundle) == 0 {
		d.Reason, d.Message = ReasonCAUnusable, prefix+fmt.Sprintf("CA Secret %s/%s has no usable signing CA", s.Namespace, desired.CASecretName)
		return d
	}
	ns, name := desired.ServerNamespace(cr, s), desired.ServingSecretName(cr)
	cert, err := pki.ParseCertPEM(out.Serving.Cert)
	if err != nil {
		// The planner issues the certificate once the configuration, if it
		// exists, carries the bundle: publish it, or neither ever happens.
		d.CABundle, d.BundleOnly, d.RequeueAfter = out.Bundle, true, out.RequeueAfter
		d.Reason, d.Message = reasonNoCertificate, prefix+fmt.Sprintf("serving certificate %s/%s not issued yet", ns, name)
		return d
	}
	d.CABundle = out.Bundle
	d.secret = desired.ServingSecret(cr, s, out.Serving.Cert, out.Serving.Key, out.Bundle)
	d.Keep = []client.Object{d.secret}
	drain, until := out.Draining, out.DrainingUntil
	if current != nil {
		if old, oldUntil := drainingFromAnnotations(current.Annotations, now); old != nil {
			drain = append(slices.Clone(drain), old...)
			if until.IsZero() {
				until = oldUntil
			}
		}
	}
	d.RequeueAfter = out.RequeueAfter
	// The renew-now token the certificate answers: the CR's when issued
	// now, else the one recorded.
	handled := ""
	if current != nil {
		handled = current.Annotations[annotationRenewedFor]
	}
	if tok := cr.Object.GetAnnotations()[v1alpha1.AnnotationRenewCertificate]; tok != "" && out.IssueReason != "" {
		handled = tok
	}
	if handled != "" {
		d.secret.Annotations = map[string]string{annotationRenewedFor: handled}
	}
	if len(drain) > 0 {
		if d.secret.Annotations == nil {
			d.secret.Annotations = map[string]string{}
		}
		d.secret.Annotations[annotationDrainingCerts], d.secret.Annotations[annotationDrainingUntil] = string(drain), fmtTime(until)
		// The retired CA can be dropped once the grace period ends.
		d.RequeueAfter = requeue.Sooner(d.RequeueAfter, max(until.Sub(now), time.Second))
	}
	d.issueReason = out.IssueReason
	d.NotAfter, d.RenewAt = cert.NotAfter, pki.RenewalTime(cert, cs.Policy.ServingRenewFraction)
	d.Ready, d.Reason = true, ReasonValid
	if d.issueReason != "" {
		d.Reason = ReasonIssued
		prefix += "issued (" + out.IssueReason + "); "
	}
	d.Message = prefix + fmt.Sprintf("serving certificate %s/%s for %v valid until %s, renewal at %s",
		ns, name, out.Serving.DNSNames, fmtTime(d.NotAfter), fmtTime(d.RenewAt))
	return d
}

// userSecretState checks a user-provided serving Secret (mode Secret):
// tls.crt, tls.key and ca.crt must be present, the key must match, and the
// certificate must verify for "<svc>.<ns>.svc" against ca.crt at now, as the
// API server will check it.
func userSecretState(cr desired.CR, s desired.Settings, secret *corev1.Secret, now time.Time) State {
	ns := desired.ServerNamespace(cr, s)
	if secret == nil {
		return State{Reason: ReasonSecretMissing, Message: fmt.Sprintf("Secret %s/%s not found", ns, cr.Certificate.SecretName)}
	}
	bad := func(err error) State {
		return State{Reason: reasonSecretInvalid, Message: fmt.Sprintf("Secret %s/%s: %v", ns, secret.Name, err)}
	}
	bundle := secret.Data[desired.SecretKeyCA]
	if len(bundle) == 0 {
		return bad(errors.New("no ca.crt"))
	}
	kp, err := pki.ParseKeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return bad(err)
	}
	host := pki.ServingDNSNames(cr.Base(), ns, "")[0]
	if err := pki.VerifyServing(kp.Cert, bundle, host, now); err != nil {
		return bad(fmt.Errorf("tls.crt does not verify for %s against ca.crt: %w", host, err))
	}
	return State{
		CABundle: bundle, Publish: publishWithOverlap, NotAfter: kp.Cert.NotAfter, RenewAt: pki.RenewalTime(kp.Cert, 0),
		Ready: true, Reason: ReasonValid,
		Message: fmt.Sprintf("user-provided serving certificate %s/%s valid until %s", ns, secret.Name, fmtTime(kp.Cert.NotAfter)),
	}
}

// certManagerState is CertificateReady and the caBundle in mode
// CertManager, from the live Certificate and its Secret (either nil when
// missing). The caBundle is the Secret's ca.crt whenever its tls.crt
// verifies for "<svc>.<ns>.svc" against it at now, as the API server will
// check it, even while cert-manager reports a failed renewal (the current
// certificate still serves); Ready also needs cert-manager's Ready=True.
// NotAfter and RenewAt come from the Certificate's status.
func certManagerState(cr desired.CR, s desired.Settings, crt *cmapi.Certificate, secret *corev1.Secret, now time.Time) State {
	ns, name := desired.ServerNamespace(cr, s), cr.Base()
	if crt == nil {
		return State{Reason: ReasonCertificatePending, Message: fmt.Sprintf("cert-manager Certificate %s/%s not created yet", ns, name)}
	}
	var ready *cmapi.CertificateCondition
	for i := range crt.Status.Conditions {
		if crt.Status.Conditions[i].Type == cmapi.CertificateConditionReady {
			ready = &crt.Status.Conditions[i]
		}
	}
	st := State{Publish: publishUnlessInjected}
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
	case len(secret.Data[desired.SecretKeyCA]) == 0:
		verr = fmt.Errorf("Secret %s/%s has no ca.crt (the issuer must provide one for the caBundle)", ns, secretName)
	default:
		kp, err := pki.ParseKeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
		if err != nil {
			verr = fmt.Errorf("Secret %s/%s: %w", ns, secretName, err)
			break
		}
		host := pki.ServingDNSNames(name, ns, "")[0]
		if err := pki.VerifyServing(kp.Cert, secret.Data[desired.SecretKeyCA], host, now); err != nil {
			verr = fmt.Errorf("Secret %s/%s: tls.crt does not verify for %s against ca.crt: %w", ns, secretName, host, err)
			break
		}
		st.CABundle = secret.Data[desired.SecretKeyCA]
		if st.NotAfter.IsZero() {
			st.NotAfter = kp.Cert.NotAfter
		}
	}
	switch {
	case ready == nil:
		st.Reason, st.Message = ReasonCertificatePending, fmt.Sprintf("waiting for cert-manager to issue Certificate %s/%s", ns, name)
	case ready.Status != cmmeta.ConditionTrue:
		st.Reason, st.Message = reasonCertificateNotReady, fmt.Sprintf("cert-manager Certificate %s/%s is not Ready (%s): %s", ns, name, ready.Reason, ready.Message)
	case verr != nil:
		st.Reason, st.Message = reasonSecretInvalid, fmt.Sprintf("cert-manager Certificate %s/%s is Ready but %v", ns, name, verr)
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

// servingAsIs is the desired serving Secret equal to what was served (its
// certificate, key, ca.crt and mode CSR annotations).
func servingAsIs(cr desired.CR, s desired.Settings, live *corev1.Secret) *corev1.Secret {
	sec := desired.ServingSecret(cr, s, live.Data[corev1.TLSCertKey], live.Data[corev1.TLSPrivateKeyKey], live.Data[desired.SecretKeyCA])
	sec.Annotations = map[string]string{}
	for _, k := range []string{annotationCSRHash, annotationCSR, annotationCSRDrainingCAs, annotationCSRDrainingUntil, annotationRenewedFor} {
		if v, ok := live.Annotations[k]; ok {
			sec.Annotations[k] = v
		}
	}
	return sec
}

// MissingOwners returns the owners (by UID) that refs lacks.
func MissingOwners(refs, owners []metav1.OwnerReference) []metav1.OwnerReference {
	var out []metav1.OwnerReference
	for _, o := range owners {
		found := false
		for _, r := range refs {
			found = found || r.UID == o.UID
		}
		if !found {
			out = append(out, o)
		}
	}
	return out
}
