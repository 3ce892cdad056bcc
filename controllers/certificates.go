package controllers

import (
	"errors"
	"fmt"
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
	ReasonNotSupported  = "NotSupported"
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
}

// NewCASecretData generates the data of a new installation CA Secret, in the
// layout internal/certs.ParseCASecret reads (active-cert, active-key, ca.crt),
// so the rotation planner can take it over later.
func NewCASecretData(now time.Time) (map[string][]byte, error) {
	st, err := certs.Apply(certs.State{}, certs.Step{Kind: certs.StepCreateCA}, now, certs.Policy{})
	if err != nil {
		return nil, err
	}
	return st.CA, nil
}

// SelfSignedState decides the serving Secret of op from the CA Secret data
// and the current serving Secret (nil if missing) at now. The certificate is
// kept unless certs.ServingRenewalReason finds a reason to re-issue it
// (missing, unparsable, wrong SANs or CA, past 2/3 of its lifetime...).
// The error is non-nil only if generating a certificate failed; an unusable
// CA is reported as a not-ready state.
func SelfSignedState(op Operand, s Settings, caData map[string][]byte, current *corev1.Secret, now time.Time) (CertState, error) {
	ca := certs.ParseCASecret(caData, now)
	if ca.Active == nil {
		return CertState{Reason: ReasonCAUnusable, Message: fmt.Sprintf(
			"CA Secret %s/%s has no usable signing CA (%v); CA rotation is not supported yet", s.Namespace, CASecretName, ca.Problems)}, nil
	}
	bundle := caData[certs.SecretKeyBundle]
	if len(bundle) == 0 {
		bundle = ca.Active.CertPEM
	}
	svc, ns := op.Kind.BaseName(op.Object.GetName()), ServerNamespace(op, s)
	names := certs.ServingDNSNames(svc, ns, "")
	var certPEM, keyPEM []byte
	if current != nil {
		certPEM, keyPEM = current.Data[corev1.TLSCertKey], current.Data[corev1.TLSPrivateKeyKey]
	}
	st := CertState{CABundle: bundle}
	reason, msg := certs.ServingRenewalReason(certs.ServingCheck{
		CertPEM: certPEM, KeyPEM: orEmpty(keyPEM), DNSNames: names, Signer: ca.Active.Cert,
	}, now)
	if reason != "" {
		kp, err := certs.NewServingCert(ca.Active, certs.ServingOptions{Service: svc, Namespace: ns, Clock: certs.FixedClock(now)})
		if err != nil {
			return CertState{}, fmt.Errorf("issue serving certificate for %s/%s: %w", ns, svc, err)
		}
		certPEM, keyPEM = kp.CertPEM, kp.KeyPEM
		st.Issued, st.IssueReason = true, reason
		st.Reason = ReasonIssued
		st.Message = fmt.Sprintf("issued (%s: %s); ", reason, msg)
	} else {
		st.Reason = ReasonValid
	}
	cert, err := certs.ParseCertPEM(certPEM)
	if err != nil {
		return CertState{}, fmt.Errorf("parse serving certificate: %w", err)
	}
	st.Secret = ServingSecret(op, s, certPEM, keyPEM, bundle)
	st.NotAfter, st.RenewAt = cert.NotAfter, certs.RenewalTime(cert, 0)
	st.Ready = true
	st.Message += fmt.Sprintf("serving certificate %s/%s for %v valid until %s, renewal at %s",
		ns, ServingSecretName(op), names, fmtTime(st.NotAfter), fmtTime(st.RenewAt))
	if at := certs.CARotationTime(ca.Active.Cert, certs.Policy{}); !now.Before(at) {
		st.Message += fmt.Sprintf("; CA %q is due for rotation since %s (expires %s) and CA rotation is not supported yet",
			ca.Active.Cert.Subject.CommonName, fmtTime(at), fmtTime(ca.Active.Cert.NotAfter))
	}
	return st, nil
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
