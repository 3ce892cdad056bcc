package controllers

import (
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hookwright/hookwright/internal/certs"
)

// Condition reasons of CertificateReady.
const (
	ReasonIssued        = "Issued"
	ReasonValid         = "Valid"
	ReasonCAUnusable    = "CAUnusable"
	ReasonSecretInvalid = "SecretInvalid"
	ReasonSecretMissing = "SecretMissing"
)

// SecretKeyCA is the trust bundle key of a serving Secret (as cert-manager
// writes it).
const SecretKeyCA = "ca.crt"

// CertState is the certificate side of one operand's desired state.
type CertState struct {
	// CABundle is the PEM trust bundle for the webhook configuration; nil
	// when no usable certificate exists (the configuration is then not
	// written, so the API server is never pointed at an unverifiable server).
	CABundle []byte
	// Secret is the serving Secret to apply (SelfSigned), nil in mode Secret.
	Secret *corev1.Secret
	// NotAfter and RenewAt of the serving certificate (zero when unknown).
	NotAfter, RenewAt time.Time
	// Issued is set when a new serving certificate was generated, with the
	// certs.Reason* constant that caused it in IssueReason.
	Issued      bool
	IssueReason string
	// Ready, Reason and Message fill the CertificateReady condition.
	Ready           bool
	Reason, Message string

	// SelfSigned only. CAData is the CA Secret data to write (nil: unchanged).
	CAData map[string][]byte
	// Steps the planner applied in this reconcile; Last is where it stopped.
	Steps []certs.Step
	Last  certs.Step
	// Rotating: a next or retired CA exists.
	Rotating bool
	// DrainingUntil is when the Secret's draining certificates stop counting.
	DrainingUntil time.Time
	// RequeueAfter is when the planner wants to look again (0: on events).
	RequeueAfter time.Duration
}

// NewCASecretData generates the data of a new installation CA Secret with
// policy p, in the layout internal/certs.ParseCASecret reads (active-cert,
// active-key, ca.crt).
func NewCASecretData(now time.Time, p certs.Policy) (map[string][]byte, error) {
	st, err := certs.Apply(certs.State{}, certs.Step{Kind: certs.StepCreateCA}, now, p)
	if err != nil {
		return nil, err
	}
	return st.CA, nil
}

// SelfSignedState is AdvanceCertificates for an installation with op as its
// only CR: caData is the CA Secret data (nil: none yet), current the serving
// Secret (nil if missing), and the configuration is taken to carry the CA
// Secret's ca.crt. CA Secret changes are returned in CertState.CAData. The
// error is non-nil only if generating a certificate failed.
func SelfSignedState(op Operand, s Settings, caData map[string][]byte, current *corev1.Secret, now time.Time) (CertState, error) {
	own := servingKey(op, s)
	in := CertInputs{
		Own: own, OwnConfig: op.Kind.BaseName(op.Object.GetName()), Now: now, Settings: s.Certificates,
		State: certs.State{CA: caData, Serving: map[string]certs.Serving{own: servingOf(op, s, current)}},
	}
	if b := caData[certs.SecretKeyBundle]; len(b) > 0 {
		in.State.Published = map[string][]byte{in.OwnConfig: b}
	}
	if current != nil {
		d, _ := DrainingFromAnnotations(current.Annotations, now)
		in.State.Draining = splitPEM(d)
	}
	out, err := AdvanceCertificates(in)
	if err != nil {
		return CertState{}, err
	}
	return certStateFrom(op, s, out, current, now), nil
}

// servingKey names op's serving certificate in certs.State.Serving.
func servingKey(op Operand, s Settings) string {
	return ServerNamespace(op, s) + "/" + ServingSecretName(op)
}

// servingOf is op's serving certificate as the planner sees it: the Secret's
// tls.crt and tls.key (a missing key is present-but-empty, so it is checked)
// and the SANs the server must have.
func servingOf(op Operand, s Settings, sec *corev1.Secret) certs.Serving {
	sv := certs.Serving{DNSNames: certs.ServingDNSNames(op.Kind.BaseName(op.Object.GetName()), ServerNamespace(op, s), ""), Key: []byte{}}
	if sec != nil {
		sv.Cert, sv.Key = sec.Data[corev1.TLSCertKey], orEmpty(sec.Data[corev1.TLSPrivateKeyKey])
	}
	return sv
}

// certStateFrom turns the planner's outcome into op's serving Secret and
// CertificateReady. A certificate replaced in this reconcile, and one still
// draining from an earlier replacement, are recorded in the Secret's
// draining annotations until their grace period ends.
func certStateFrom(op Operand, s Settings, out CertOutcome, current *corev1.Secret, now time.Time) CertState {
	st := CertState{CAData: out.CA, Steps: out.Steps, Last: out.Last, Rotating: out.Last.Rotating}
	prefix := describeSteps(out.Steps, out.Last)
	if len(out.Bundle) == 0 {
		st.Reason, st.Message = ReasonCAUnusable, prefix+fmt.Sprintf("CA Secret %s/%s has no usable signing CA", s.Namespace, CASecretName)
		return st
	}
	ns, name := ServerNamespace(op, s), ServingSecretName(op)
	cert, err := certs.ParseCertPEM(out.Serving.Cert)
	if err != nil {
		st.Reason, st.Message = ReasonNoCertificate, prefix+fmt.Sprintf("serving certificate %s/%s not issued yet", ns, name)
		return st
	}
	st.CABundle = out.Bundle
	st.Secret = ServingSecret(op, s, out.Serving.Cert, out.Serving.Key, out.Bundle)
	drain, until := out.Draining, out.DrainingUntil
	if current != nil {
		if old, oldUntil := DrainingFromAnnotations(current.Annotations, now); old != nil {
			drain = append(slices.Clone(drain), old...)
			if until.IsZero() {
				until = oldUntil
			}
		}
	}
	if len(drain) > 0 {
		st.Secret.Annotations = map[string]string{AnnotationDrainingCerts: string(drain), AnnotationDrainingUntil: fmtTime(until)}
		st.DrainingUntil = until
	}
	st.Issued, st.IssueReason = out.IssueReason != "", out.IssueReason
	st.NotAfter, st.RenewAt = cert.NotAfter, certs.RenewalTime(cert, s.Certificates.Policy.ServingRenewFraction)
	st.RequeueAfter = out.RequeueAfter
	st.Ready, st.Reason = true, ReasonValid
	if st.Issued {
		st.Reason = ReasonIssued
		prefix += "issued (" + out.IssueReason + "); "
	}
	st.Message = prefix + fmt.Sprintf("serving certificate %s/%s for %v valid until %s, renewal at %s",
		ns, name, out.Serving.DNSNames, fmtTime(st.NotAfter), fmtTime(st.RenewAt))
	return st
}

// orEmpty makes a missing key a present-but-empty one, so
// ServingRenewalReason checks it (nil would skip the key check).
func orEmpty(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// UserSecretState checks a user-provided serving Secret (mode Secret):
// tls.crt, tls.key and ca.crt must be present, the key must match, and the
// certificate must verify for "<svc>.<ns>.svc" against ca.crt at now, as the
// API server will check it.
func UserSecretState(op Operand, s Settings, secret *corev1.Secret, now time.Time) CertState {
	ns := ServerNamespace(op, s)
	if secret == nil {
		return CertState{Reason: ReasonSecretMissing, Message: fmt.Sprintf("Secret %s/%s not found", ns, op.Certificate.SecretName)}
	}
	bad := func(err error) CertState {
		return CertState{Reason: ReasonSecretInvalid, Message: fmt.Sprintf("Secret %s/%s: %v", ns, secret.Name, err)}
	}
	bundle := secret.Data[SecretKeyCA]
	if len(bundle) == 0 {
		return bad(errors.New("no ca.crt"))
	}
	kp, err := certs.ParseKeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return bad(err)
	}
	host := certs.ServingDNSNames(op.Kind.BaseName(op.Object.GetName()), ns, "")[0]
	if err := certs.VerifyServing(kp.Cert, bundle, host, now); err != nil {
		return bad(fmt.Errorf("tls.crt does not verify for %s against ca.crt: %w", host, err))
	}
	return CertState{
		CABundle: bundle, NotAfter: kp.Cert.NotAfter, RenewAt: certs.RenewalTime(kp.Cert, 0),
		Ready: true, Reason: ReasonValid,
		Message: fmt.Sprintf("user-provided serving certificate %s/%s valid until %s", ns, secret.Name, fmtTime(kp.Cert.NotAfter)),
	}
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
