// Package csrsign decides whether the operator's signer may sign a
// certificates.k8s.io/v1 CertificateSigningRequest, and signs it with the
// installation CA. The operator signs for one signerName (default
// hookwright.io/webhook-serving, KEP-1513 "signerName"): only serving
// certificates for the DNS names of Services in the allowed server
// namespaces, so that whoever may create and approve a CSR for it cannot
// get a client certificate or a certificate for any other name out of it.
//
// Check is a pure function of the request and the Policy (the Services it
// may name are passed in); Sign issues the certificate from a Grant.
//
// It must not import a Kubernetes client, the operator or the webhook
// servers: its controllers (controllers/csrsigner) do the I/O.
package csrsign

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// Refusal reasons, the reason of the CSR's Failed condition.
const (
	// reasonBadRequest: spec.request is not one PEM CERTIFICATE REQUEST
	// with a valid self-signature.
	reasonBadRequest = "InvalidRequest"
	// ReasonForbiddenUsage: a usage other than server auth, digital
	// signature and key encipherment (client auth among them), or no
	// server auth.
	ReasonForbiddenUsage = "ForbiddenUsage"
	// ReasonForbiddenSubject: a subject field besides a CommonName that is
	// one of the DNS names (an Organization would be a group claim).
	ReasonForbiddenSubject = "ForbiddenSubject"
	// ReasonForbiddenName: an email or URI SAN, no DNS name, or a DNS name
	// that is not <service>.<namespace>.svc[.<cluster domain>].
	ReasonForbiddenName = "ForbiddenName"
	// ReasonNamespaceNotAllowed: a Service outside the allowed server namespaces.
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	// ReasonServiceNotFound: a named Service does not exist.
	ReasonServiceNotFound = "ServiceNotFound"
	// ReasonForbiddenIP: an IP SAN that is not a ClusterIP of a named Service.
	ReasonForbiddenIP = "ForbiddenIP"
	// ReasonLifetimeTooLong: spec.expirationSeconds above Policy.MaxValidity.
	ReasonLifetimeTooLong = "LifetimeTooLong"
	// reasonWeakKey: a public key other than ECDSA P-256/P-384/P-521,
	// Ed25519 or RSA of at least 2048 bits.
	reasonWeakKey = "UnsupportedKey"
)

// DefaultMaxValidity bounds what the signer issues: the serving lifetime of
// SelfSigned mode (pki.DefaultServingValidity, 90 days).
const DefaultMaxValidity = pki.DefaultServingValidity

// minValidity is the shortest lifetime the API accepts in
// spec.expirationSeconds (k8s.io/kubernetes pkg/apis/certificates/validation).
const minValidity = 10 * time.Minute

// Refusal is why a request is not signed: Reason (one of the Reason*
// constants) and a message naming the offending value.
type Refusal struct {
	Reason  string
	Message string
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Message }

func refuse(reason, format string, a ...any) *Refusal {
	return &Refusal{Reason: reason, Message: fmt.Sprintf(format, a...)}
}

// Service is what the policy knows of one Service: its ClusterIPs (empty
// for a headless Service).
type Service struct {
	ClusterIPs []netip.Addr
}

// Policy is what the signer signs.
type Policy struct {
	// Namespaces are the allowed server namespaces (--allowed-server-namespaces).
	Namespaces []string
	// Services holds the Services that exist, keyed "<namespace>/<name>";
	// callers fill it for the names the request asks for (see ServiceKeys).
	Services map[string]Service
	// ClusterDomain is the DNS suffix accepted after ".svc"; empty means
	// pki.DefaultClusterDomain.
	ClusterDomain string
	// MaxValidity is the longest lifetime signed; 0 means DefaultMaxValidity.
	// It is also the lifetime of a request without expirationSeconds.
	MaxValidity time.Duration
}

// AllowsNamespace reports whether Services of ns may be named.
func (p Policy) AllowsNamespace(ns string) bool { return slices.Contains(p.Namespaces, ns) }

// Request is the part of a CertificateSigningRequest the policy reads.
type Request struct {
	// PEM is spec.request.
	PEM []byte
	// Usages is spec.usages.
	Usages []certificatesv1.KeyUsage
	// ExpirationSeconds is spec.expirationSeconds (nil: not requested).
	ExpirationSeconds *int32
}

// Grant is what Check allows: the certificate to issue.
type Grant struct {
	CSR      *x509.CertificateRequest
	DNSNames []string
	IPs      []netip.Addr
	// ExtKeyUsage is always serverAuth; KeyUsage digital signature, plus
	// key encipherment when requested (RSA key exchange).
	KeyUsage x509.KeyUsage
	Validity time.Duration
}

var allowedUsages = map[certificatesv1.KeyUsage]bool{
	certificatesv1.UsageServerAuth:       true,
	certificatesv1.UsageDigitalSignature: true,
	certificatesv1.UsageKeyEncipherment:  true,
}

// ParseRequest decodes spec.request: exactly one PEM CERTIFICATE REQUEST
// whose self-signature verifies.
func ParseRequest(data []byte) (*x509.CertificateRequest, error) {
	b, rest := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, refuse(reasonBadRequest, "spec.request is not a PEM CERTIFICATE REQUEST")
	}
	if more, _ := pem.Decode(rest); more != nil {
		return nil, refuse(reasonBadRequest, "spec.request holds more than one PEM block")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, refuse(reasonBadRequest, "parse certificate request: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, refuse(reasonBadRequest, "certificate request signature: %v", err)
	}
	return csr, nil
}

// serviceRef splits a DNS name <svc>.<ns>.svc or <svc>.<ns>.svc.<domain>
// into namespace and name; ok is false for any other name.
func serviceRef(dnsName, clusterDomain string) (namespace, name string, ok bool) {
	if clusterDomain == "" {
		clusterDomain = pki.DefaultClusterDomain
	}
	clusterDomain = strings.TrimSuffix(clusterDomain, ".")
	rest, found := strings.CutSuffix(dnsName, ".svc."+clusterDomain)
	if !found {
		if rest, found = strings.CutSuffix(dnsName, ".svc"); !found {
			return "", "", false
		}
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 2 || !isDNSLabel(parts[0]) || !isDNSLabel(parts[1]) {
		return "", "", false
	}
	return parts[1], parts[0], true
}

// ServiceKeys are the "<namespace>/<name>" keys of the Services a request
// names, for filling Policy.Services; nil when the request does not parse.
func ServiceKeys(data []byte, clusterDomain string) []string {
	csr, err := ParseRequest(data)
	if err != nil {
		return nil
	}
	var keys []string
	for _, n := range csr.DNSNames {
		if ns, name, ok := serviceRef(n, clusterDomain); ok && !slices.Contains(keys, ns+"/"+name) {
			keys = append(keys, ns+"/"+name)
		}
	}
	return keys
}

// Check returns the certificate to issue for r, or a *Refusal. Every rule
// is checked in a fixed order and the first broken one is reported.
func Check(p Policy, r Request) (Grant, error) {
	csr, err := ParseRequest(r.PEM)
	if err != nil {
		return Grant{}, err
	}
	g := Grant{CSR: csr, KeyUsage: x509.KeyUsageDigitalSignature}
	serverAuth := false
	for _, u := range r.Usages {
		if !allowedUsages[u] {
			return Grant{}, refuse(ReasonForbiddenUsage, "usage %q is not allowed: only %q, %q and %q", u,
				certificatesv1.UsageServerAuth, certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment)
		}
		switch u {
		case certificatesv1.UsageServerAuth:
			serverAuth = true
		case certificatesv1.UsageKeyEncipherment:
			g.KeyUsage |= x509.KeyUsageKeyEncipherment
		}
	}
	if !serverAuth {
		return Grant{}, refuse(ReasonForbiddenUsage, "usages %v lack %q", r.Usages, certificatesv1.UsageServerAuth)
	}
	if err := checkKey(csr); err != nil {
		return Grant{}, err
	}
	if len(csr.EmailAddresses) > 0 || len(csr.URIs) > 0 {
		return Grant{}, refuse(ReasonForbiddenName, "email and URI names are not allowed (%v %v)", csr.EmailAddresses, csr.URIs)
	}
	if len(csr.DNSNames) == 0 {
		return Grant{}, refuse(ReasonForbiddenName, "no DNS name: a serving certificate names <service>.<namespace>.svc")
	}
	var ips []netip.Addr
	for _, n := range csr.DNSNames {
		ns, name, ok := serviceRef(n, p.ClusterDomain)
		if !ok {
			return Grant{}, refuse(ReasonForbiddenName, "DNS name %q is not <service>.<namespace>.svc[.%s]", n, orDefault(p.ClusterDomain))
		}
		if !p.AllowsNamespace(ns) {
			return Grant{}, refuse(ReasonNamespaceNotAllowed, "DNS name %q: namespace %q is not an allowed server namespace (%s)", n, ns, strings.Join(p.Namespaces, ","))
		}
		svc, ok := p.Services[ns+"/"+name]
		if !ok {
			return Grant{}, refuse(ReasonServiceNotFound, "DNS name %q: Service %s/%s does not exist", n, ns, name)
		}
		ips = append(ips, svc.ClusterIPs...)
		if !slices.Contains(g.DNSNames, n) {
			g.DNSNames = append(g.DNSNames, n)
		}
	}
	for _, ip := range csr.IPAddresses {
		a, ok := netip.AddrFromSlice(ip)
		if !ok || !slices.Contains(ips, a.Unmap()) {
			return Grant{}, refuse(ReasonForbiddenIP, "IP %s is not a ClusterIP of the named Services %v", ip, ips)
		}
		if !slices.Contains(g.IPs, a.Unmap()) {
			g.IPs = append(g.IPs, a.Unmap())
		}
	}
	s := csr.Subject
	if len(s.Organization)+len(s.OrganizationalUnit)+len(s.Country)+len(s.Province)+len(s.Locality)+len(s.StreetAddress)+len(s.PostalCode) > 0 || s.SerialNumber != "" {
		return Grant{}, refuse(ReasonForbiddenSubject, "subject %q: only a CommonName is allowed", s.String())
	}
	if s.CommonName != "" && !slices.Contains(g.DNSNames, s.CommonName) {
		return Grant{}, refuse(ReasonForbiddenSubject, "CommonName %q is not one of the DNS names %v", s.CommonName, g.DNSNames)
	}
	limit := p.MaxValidity
	if limit <= 0 {
		limit = DefaultMaxValidity
	}
	g.Validity = limit
	if r.ExpirationSeconds != nil {
		d := time.Duration(*r.ExpirationSeconds) * time.Second
		if d > limit {
			return Grant{}, refuse(ReasonLifetimeTooLong, "expirationSeconds %d exceeds the signer's maximum %d (%s)", *r.ExpirationSeconds, int64(limit/time.Second), limit)
		}
		g.Validity = max(d, minValidity)
	}
	return g, nil
}

func checkKey(csr *x509.CertificateRequest) error {
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return nil
		}
		return refuse(reasonWeakKey, "ECDSA curve %s is not allowed", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return refuse(reasonWeakKey, "RSA key of %d bits: at least 2048 needed", k.N.BitLen())
		}
		return nil
	case ed25519.PublicKey:
		return nil
	}
	return refuse(reasonWeakKey, "public key type %T is not allowed", csr.PublicKey)
}

func orDefault(domain string) string {
	if domain == "" {
		return pki.DefaultClusterDomain
	}
	return domain
}

// isDNSLabel reports whether s is an RFC 1123 label (what Service and
// namespace names are).
func isDNSLabel(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }
