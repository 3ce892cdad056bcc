package pki

import (
	"crypto/x509"
	"fmt"
	"slices"
	"time"
)

// Reasons a serving certificate must be (re)issued. They are CamelCase so a
// caller can use them directly as an Event or condition reason.
const (
	ReasonMissing     = "Missing"       // no certificate data
	ReasonUnparsable  = "Unparsable"    // certificate or key PEM does not parse
	reasonKeyMismatch = "KeyMismatch"   // key is not the certificate's
	ReasonSANMismatch = "SANMismatch"   // DNS SANs differ from the wanted set
	reasonUsage       = "UsageMismatch" // not a serverAuth leaf
	ReasonWrongCA     = "WrongCA"       // not signed by the current signing CA
	reasonNotYetValid = "NotYetValid"   // NotBefore in the future (clock moved back)
	ReasonExpired     = "Expired"       // past NotAfter
	ReasonRenewalDue  = "RenewalDue"    // past the renewal point of its lifetime
	// ReasonRenewalRequested: an administrator asked for a new one now.
	ReasonRenewalRequested = "RenewalRequested"
)

// RenewalTime is the instant at which fraction (0<f<=1; anything else means
// defaultRenewFraction) of cert's lifetime NotBefore..NotAfter has elapsed.
func RenewalTime(cert *x509.Certificate, fraction float64) time.Time {
	if fraction <= 0 || fraction > 1 {
		fraction = defaultRenewFraction
	}
	life := cert.NotAfter.Sub(cert.NotBefore)
	return cert.NotBefore.Add(time.Duration(float64(life) * fraction))
}

// ServingCheck is the input of ServingRenewalReason.
type ServingCheck struct {
	CertPEM []byte // serving certificate; extra blocks after the first are ignored
	// KeyPEM is the serving key. nil skips the key check (for a certificate
	// observed on the wire, where the key is not visible).
	KeyPEM []byte
	// DNSNames is the exact SAN set wanted (order-insensitive).
	DNSNames []string
	// Signer is the current signing CA; nil skips the chain check.
	Signer *x509.Certificate
	// RenewFraction of the lifetime after which to renew; 0 means defaultRenewFraction.
	RenewFraction float64
	// RenewRequested renews a certificate that is otherwise fine.
	RenewRequested bool
}

// ServingRenewalReason decides whether a serving certificate must be
// (re)issued at now. It returns reason "" when the certificate is fine, or one
// of the Reason* constants with a human-readable message. Checks run from
// "unusable" to "merely due", so the most severe reason wins.
func ServingRenewalReason(c ServingCheck, now time.Time) (reason, message string) {
	if len(c.CertPEM) == 0 {
		return ReasonMissing, "no serving certificate"
	}
	cert, err := ParseCertPEM(c.CertPEM)
	if err != nil {
		return ReasonUnparsable, fmt.Sprintf("certificate: %v", err)
	}
	if c.KeyPEM != nil {
		if reason, msg := keyFits(cert, c.KeyPEM); reason != "" {
			return reason, msg
		}
	}
	if !sameSet(cert.DNSNames, c.DNSNames) {
		return ReasonSANMismatch, fmt.Sprintf("SANs %v, want %v", cert.DNSNames, c.DNSNames)
	}
	if cert.IsCA || !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		return reasonUsage, "certificate lacks serverAuth extended key usage or is a CA"
	}
	if c.Signer != nil && !SignedBy(cert, c.Signer) {
		return ReasonWrongCA, fmt.Sprintf("issued by %q, current CA is %q", cert.Issuer.CommonName, c.Signer.Subject.CommonName)
	}
	if now.Before(cert.NotBefore) {
		return reasonNotYetValid, fmt.Sprintf("not valid before %s", fmtTime(cert.NotBefore))
	}
	if !now.Before(cert.NotAfter) {
		return ReasonExpired, fmt.Sprintf("expired at %s", fmtTime(cert.NotAfter))
	}
	if at := RenewalTime(cert, c.RenewFraction); !now.Before(at) {
		return ReasonRenewalDue, fmt.Sprintf("renewal due at %s, expires %s", fmtTime(at), fmtTime(cert.NotAfter))
	}
	if c.RenewRequested {
		return ReasonRenewalRequested, "renewal requested by an administrator"
	}
	return "", ""
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(slices.Compact(x), slices.Compact(y))
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// keyFits checks that keyPEM parses and is cert's private key; a pair
// found to fit is remembered (checks), since parsing an ECDSA key derives
// its public key, a scalar multiplication.
func keyFits(cert *x509.Certificate, keyPEM []byte) (reason, message string) {
	k := pairKey(cert.Raw, keyPEM)
	if ok, seen := checks.get(k); seen && ok {
		return "", ""
	}
	key, err := ParseKeyPEM(keyPEM)
	if err != nil {
		return ReasonUnparsable, fmt.Sprintf("key: %v", err)
	}
	if !keyMatches(cert, key) {
		return reasonKeyMismatch, errKeyMismatch.Error()
	}
	checks.put(k, true)
	return "", ""
}
