// Package csrplan plans certificate mode CSR: a webhook server's serving
// certificate requested through the certificates.k8s.io/v1
// CertificateSigningRequest API (KEP-1513 signerName) and trusted through
// the signer's ClusterTrustBundles (KEP-3257).
//
// plan is a pure function of what one reconcile observed (the serving
// Secret, the CR's CSRs, the signer's trust anchors, the caBundle as read
// back) and returns what to do next. The overlap rules are SelfSigned
// mode's: a certificate is only served once the CA that issued it is in the
// published caBundle, and the CA of the certificate it replaces stays there
// for a drain grace period after the switch.
//
// It must not import a Kubernetes client, the operator or the webhook
// servers: its I/O is internal/certificates/sources/csr.go.
package csrplan

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/requeue"
)

// Reasons of the CertificateReady condition in mode CSR.
const (
	ReasonIssued             = "Issued"
	reasonRequested          = "CSRCreated"
	ReasonWaitingForApproval = "WaitingForApproval"
	reasonWaitingForSigner   = "WaitingForSigner"
	ReasonSignerSilent       = "SignerNotResponding"
	ReasonDenied             = "CSRDenied"
	reasonFailed             = "CSRFailed"
	reasonUntrusted          = "IssuerNotTrusted"
	reasonWaitingForBundle   = "WaitingForCABundle"
	reasonBadCertificate     = "InvalidCertificate"
	reasonNoTrust            = "NoTrustBundle"
)

// defaultSignerWait is how long an approved CSR may go unsigned before the
// condition says the signer does not answer.
const defaultSignerWait = 2 * time.Minute

// poll is how often a plan waiting on something without an event (the
// caBundle being read back) looks again.
const poll = time.Second

// Spec is what the CR asks for.
type Spec struct {
	SignerName        string
	Approve           bool
	ExpirationSeconds *int32
	// DNSNames of the server's Service (pki.ServingDNSNames).
	DNSNames []string
}

// hash identifies the request Spec makes: a CSR or a certificate made for
// another hash (signer, names or lifetime changed) is replaced.
func (s Spec) hash() string {
	names := slices.Clone(s.DNSNames)
	slices.Sort(names)
	exp := ""
	if s.ExpirationSeconds != nil {
		exp = strconv.Itoa(int(*s.ExpirationSeconds))
	}
	sum := sha256.Sum256([]byte(s.SignerName + "\n" + strings.Join(names, ",") + "\n" + exp))
	return hex.EncodeToString(sum[:8])
}

// Serving is the serving Secret's certificate state.
type Serving struct {
	Cert []byte // tls.crt: the issued chain, leaf first
	Key  []byte // tls.key
	CA   []byte // ca.crt: the trust anchors the chain verifies against
	Hash string // the Spec.Hash it was requested for
	// CSR names the request it came from.
	CSR string
}

// CSR is one CertificateSigningRequest of the CR, as observed.
type CSR struct {
	Name    string
	Created time.Time
	Hash    string // Spec.Hash it was made for (an annotation)
	Request []byte // spec.request
	// Approved, Denied and Failed are its True conditions; Reason and
	// Message are those of Denied or Failed.
	Approved, Denied, Failed bool
	ApprovedAt               time.Time
	Reason, Message          string
	Certificate              []byte // status.certificate
}

// Input is everything one plan looks at.
type Input struct {
	Now  time.Time
	Spec Spec
	// Serving is the certificate in the serving Secret (empty: none yet).
	Serving Serving
	// PendingKey is the private key (PEM) of the request in progress,
	// kept in a Secret next to the serving Secret; PendingCSR names that
	// request, or is empty to take the newest CSR for this key and Spec.
	PendingKey []byte
	PendingCSR string
	// CSRs of the CR (by label), any signer.
	CSRs []CSR
	// Trust is the union of the ClusterTrustBundles of Spec.SignerName
	// (or, where that API is absent, the fallback the caller knows).
	Trust []byte
	// Published is the caBundle of the webhook configuration as read back;
	// PublishedExists is false while it does not exist.
	Published       []byte
	PublishedExists bool
	// DrainingCAs are the CAs of a replaced certificate, trusted until
	// DrainingUntil.
	DrainingCAs   []byte
	DrainingUntil time.Time
	// RenewFraction of a certificate's life after which it is renewed
	// (0: pki.DefaultRenewFraction); DrainGrace keeps a replaced
	// certificate's CAs published; SignerWait is defaultSignerWait when 0.
	RenewFraction float64
	DrainGrace    time.Duration
	SignerWait    time.Duration
	// RenewRequested: an administrator asked for a new certificate now
	// (v1alpha1.AnnotationRenewCertificate not yet handled).
	RenewRequested bool
}

// CreateCSR is a request to create.
type CreateCSR struct {
	Hash              string
	DNSNames          []string
	SignerName        string
	ExpirationSeconds *int32
	Usages            []certificatesv1.KeyUsage
}

// Plan is what to do; the caller performs the actions in field order and
// plans again when something changed.
type Plan struct {
	// NeedKey: generate a key (NewKey) and keep it as the pending key.
	NeedKey bool
	// Create this CSR from the pending key, and record its name as pending.
	Create *CreateCSR
	// Approve names a CSR to approve (Spec.Approve).
	Approve string
	// Serve is the new content of the serving Secret; the pending key and
	// CSR are cleared, the replaced CAs drain until DrainingUntil.
	Serve         *Serving
	DrainingCAs   []byte
	DrainingUntil time.Time
	// Delete are CSRs no longer needed (replaced, or for an old request).
	Delete []string
	// CABundle to publish: Trust, the served certificate's CAs and the
	// draining ones, tidied; nil when there is none.
	CABundle []byte
	// Ready, Reason and Message fill CertificateReady: Ready while a valid
	// certificate is served (even if its renewal waits).
	Ready   bool
	Reason  string
	Message string
	// Warning is set when the pending request was refused (Denied,
	// Failed) or the signer does not answer: the event to record.
	Warning string
	// RequeueAfter is when to look again without an event (0: none).
	RequeueAfter time.Duration
}

// InProgress reports whether a request is under way (its key is needed).
func (p Plan) InProgress() bool { return p.Serve == nil && p.Reason != ReasonIssued }

// ServingUsages are the usages every request asks for.
var ServingUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}

// Compute plans one step. Until a certificate is served no caBundle is
// offered for a configuration that does not exist yet: writing one would
// point the API server at a server that cannot answer (a request waiting
// for approval can wait for days).
func Compute(in Input) Plan {
	p := compute(in)
	if !p.Ready && !in.PublishedExists {
		p.CABundle = nil
	}
	return p
}

func compute(in Input) Plan {
	var p Plan
	if len(in.PendingKey) > 0 && bytes.Equal(in.PendingKey, in.Serving.Key) {
		// The key of the served certificate, left over: not a request in
		// progress (a renewal takes a new key).
		in.PendingKey, in.PendingCSR = nil, ""
	}
	hash := in.Spec.hash()
	trustCAs := parse(in.Trust)
	draining := in.DrainingCAs
	if !in.Now.Before(in.DrainingUntil) {
		draining = nil
	}
	// Which CAs the current certificate verifies against: its ca.crt, kept
	// published while it is served whatever the ClusterTrustBundles say.
	p.CABundle = pki.BuildBundle(append(append(trustCAs, parse(in.Serving.CA)...), parse(draining)...), pki.BundleOptions{Now: in.Now, Max: -1, CAOnly: true})
	if !in.DrainingUntil.IsZero() && in.Now.Before(in.DrainingUntil) {
		p.RequeueAfter = requeue.Sooner(p.RequeueAfter, in.DrainingUntil.Sub(in.Now))
	}

	current, renewReason, renewMsg := currentState(in, hash, trustCAs)
	if current != nil {
		p.Ready = true
	}
	pending := findPending(in, hash)
	// GC: every CSR other than the pending one and the one behind the served
	// certificate, once nothing waits on it.
	for _, c := range in.CSRs {
		keep := (pending != nil && c.Name == pending.Name) || (c.Name == in.Serving.CSR && current != nil)
		if !keep {
			p.Delete = append(p.Delete, c.Name)
		}
	}

	if renewReason == "" {
		p.Reason, p.Message = ReasonIssued, fmt.Sprintf("certificate from CSR %s (signer %s) valid until %s, renewal at %s",
			in.Serving.CSR, in.Spec.SignerName, fmtTime(current.NotAfter), fmtTime(pki.RenewalTime(current, in.RenewFraction)))
		p.RequeueAfter = requeue.Sooner(p.RequeueAfter, max(pki.RenewalTime(current, in.RenewFraction).Sub(in.Now), time.Second))
		return p
	}
	prefix := ""
	if current != nil {
		prefix = fmt.Sprintf("serving the certificate from CSR %s until renewed (%s: %s); ", in.Serving.CSR, renewReason, renewMsg)
	} else {
		prefix = fmt.Sprintf("no usable certificate (%s: %s); ", renewReason, renewMsg)
	}
	if len(in.PendingKey) == 0 {
		p.NeedKey = true
		p.Reason, p.Message = reasonRequested, prefix+"generating a key"
		return p
	}
	if pending == nil {
		p.Create = &CreateCSR{Hash: hash, DNSNames: slices.Clone(in.Spec.DNSNames), SignerName: in.Spec.SignerName,
			ExpirationSeconds: in.Spec.ExpirationSeconds, Usages: slices.Clone(ServingUsages)}
		p.Reason, p.Message = reasonRequested, prefix+"creating a CertificateSigningRequest for "+in.Spec.SignerName
		return p
	}
	// The pending request is kept (not deleted above).
	switch {
	case pending.Denied:
		p.Reason = ReasonDenied
		p.Message = prefix + fmt.Sprintf("CSR %s was denied (%s: %s); delete it to request again", pending.Name, pending.Reason, pending.Message)
		p.Warning = p.Message
		return p
	case pending.Failed:
		p.Reason = reasonFailed
		p.Message = prefix + fmt.Sprintf("signer %s failed CSR %s (%s: %s); delete it to request again", in.Spec.SignerName, pending.Name, pending.Reason, pending.Message)
		p.Warning = p.Message
		return p
	case !pending.Approved:
		if in.Spec.Approve {
			p.Approve = pending.Name
			p.Reason, p.Message = reasonWaitingForSigner, prefix+fmt.Sprintf("approving CSR %s", pending.Name)
			return p
		}
		p.Reason = ReasonWaitingForApproval
		p.Message = prefix + fmt.Sprintf("CSR %s waits for approval since %s (kubectl certificate approve %s)", pending.Name, fmtTime(pending.Created), pending.Name)
		return p
	case len(pending.Certificate) == 0:
		wait := in.SignerWait
		if wait <= 0 {
			wait = defaultSignerWait
		}
		since := pending.ApprovedAt
		if since.IsZero() {
			since = pending.Created
		}
		waited := in.Now.Sub(since)
		if waited >= wait {
			p.Reason = ReasonSignerSilent
			p.Message = prefix + fmt.Sprintf("CSR %s approved %s ago, signer %s has not issued it", pending.Name, waited.Round(time.Second), in.Spec.SignerName)
			p.Warning = p.Message
			return p
		}
		p.RequeueAfter = requeue.Sooner(p.RequeueAfter, wait-waited)
		p.Reason, p.Message = reasonWaitingForSigner, prefix+fmt.Sprintf("CSR %s approved, waiting for signer %s", pending.Name, in.Spec.SignerName)
		return p
	}
	// Issued: check it, find its trust anchors, and serve it only once the
	// published caBundle holds them.
	chain, err := pki.ParseCertsPEM(pending.Certificate)
	if err != nil {
		return refuseIssued(p, prefix, pending, "status.certificate: "+err.Error())
	}
	reason, msg := pki.ServingRenewalReason(pki.ServingCheck{CertPEM: pending.Certificate, KeyPEM: in.PendingKey, DNSNames: in.Spec.DNSNames, RenewFraction: in.RenewFraction}, in.Now)
	if reason != "" && reason != pki.ReasonRenewalDue {
		return refuseIssued(p, prefix, pending, reason+": "+msg)
	}
	anchors := anchorsOf(chain, trustCAs, in.Now)
	if len(anchors) == 0 {
		if len(trustCAs) == 0 {
			p.Reason = reasonNoTrust
			p.Message = prefix + fmt.Sprintf("CSR %s is issued but no ClusterTrustBundle of signer %s exists to trust it", pending.Name, in.Spec.SignerName)
		} else {
			p.Reason = reasonUntrusted
			p.Message = prefix + fmt.Sprintf("the certificate of CSR %s (issuer %q) does not verify against the ClusterTrustBundles of signer %s", pending.Name, chain[0].Issuer.CommonName, in.Spec.SignerName)
		}
		p.RequeueAfter = requeue.Sooner(p.RequeueAfter, 10*time.Second)
		return p
	}
	if in.PublishedExists && !containsAny(in.Published, anchors) {
		p.Reason = reasonWaitingForBundle
		p.Message = prefix + fmt.Sprintf("the certificate of CSR %s is issued; waiting for its CA in the caBundle before serving it", pending.Name)
		p.RequeueAfter = requeue.Sooner(p.RequeueAfter, poll)
		return p
	}
	p.Serve = &Serving{Cert: pending.Certificate, Key: in.PendingKey, CA: pki.EncodeCertsPEM(anchors), Hash: hash, CSR: pending.Name}
	if len(in.Serving.CA) > 0 {
		grace := in.DrainGrace
		if grace <= 0 {
			grace = 5 * time.Minute
		}
		p.DrainingCAs = pki.BuildBundle(append(parse(in.Serving.CA), parse(draining)...), pki.BundleOptions{Now: in.Now, Max: -1, CAOnly: true})
		p.DrainingUntil = in.Now.Add(grace)
		p.RequeueAfter = requeue.Sooner(p.RequeueAfter, grace)
	}
	p.CABundle = pki.BuildBundle(append(append(trustCAs, anchors...), append(parse(in.Serving.CA), parse(draining)...)...), pki.BundleOptions{Now: in.Now, Max: -1, CAOnly: true})
	p.Ready = true
	p.Reason, p.Message = ReasonIssued, fmt.Sprintf("certificate from CSR %s (signer %s) served, valid until %s", pending.Name, in.Spec.SignerName, fmtTime(chain[0].NotAfter))
	// The replaced request is no longer needed once the new one is served.
	p.Delete = slices.DeleteFunc(p.Delete, func(n string) bool { return n == pending.Name })
	if in.Serving.CSR != "" && in.Serving.CSR != pending.Name && findCSR(in.CSRs, in.Serving.CSR) != nil && !slices.Contains(p.Delete, in.Serving.CSR) {
		p.Delete = append(p.Delete, in.Serving.CSR)
	}
	return p
}

func refuseIssued(p Plan, prefix string, c *CSR, why string) Plan {
	p.Reason = reasonBadCertificate
	p.Message = prefix + fmt.Sprintf("the certificate issued for CSR %s is unusable (%s); delete the CSR to request again", c.Name, why)
	p.Warning = p.Message
	return p
}

// currentState returns the served leaf when it is usable (valid now, for
// the wanted request), and why it must be renewed ("" when it need not).
func currentState(in Input, hash string, trust []*x509.Certificate) (*x509.Certificate, string, string) {
	if len(in.Serving.Cert) == 0 {
		return nil, pki.ReasonMissing, "no serving certificate"
	}
	reason, msg := pki.ServingRenewalReason(pki.ServingCheck{CertPEM: in.Serving.Cert, KeyPEM: in.Serving.Key, DNSNames: in.Spec.DNSNames, RenewFraction: in.RenewFraction}, in.Now)
	leaf, err := pki.ParseCertPEM(in.Serving.Cert)
	switch {
	case reason == pki.ReasonRenewalDue:
		return leaf, reason, msg
	case reason != "":
		return nil, reason, msg
	case err != nil:
		return nil, pki.ReasonUnparsable, err.Error()
	case in.Serving.Hash != hash:
		return leaf, "RequestChanged", "spec.certificate.csr or the Service names changed"
	case in.RenewRequested:
		return leaf, pki.ReasonRenewalRequested, "renewal requested by an administrator"
	}
	// A CA rotation at the signer: once the ClusterTrustBundles no longer
	// hold the issuer, request a certificate from the new CA.
	chain, _ := pki.ParseCertsPEM(in.Serving.Cert)
	if len(trust) > 0 && len(anchorsOf(chain, trust, in.Now)) == 0 {
		return leaf, "IssuerRotated", fmt.Sprintf("issuer %q is no longer in the ClusterTrustBundles of %s", leaf.Issuer.CommonName, in.Spec.SignerName)
	}
	return leaf, "", ""
}

// anchorsOf returns the CAs of trust that chain (leaf first, then any
// intermediates) verifies against at now.
func anchorsOf(chain, trust []*x509.Certificate, now time.Time) []*x509.Certificate {
	if len(chain) == 0 {
		return nil
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	var out []*x509.Certificate
	for _, ca := range trust {
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
			out = append(out, ca)
		}
	}
	return out
}

func containsAny(bundle []byte, cas []*x509.Certificate) bool {
	return slices.ContainsFunc(cas, func(c *x509.Certificate) bool { return pki.BundleContains(bundle, c) })
}

// findPending is the request in progress: PendingCSR if it was made for
// this request and key, else (no name recorded) the newest CSR that was.
func findPending(in Input, hash string) *CSR {
	ok := func(c *CSR) bool {
		return c != nil && c.Name != in.Serving.CSR && c.Hash == hash && requestMatchesKey(c.Request, in.PendingKey)
	}
	if in.PendingCSR != "" {
		if c := findCSR(in.CSRs, in.PendingCSR); ok(c) {
			return c
		}
		return nil
	}
	var best *CSR
	for i := range in.CSRs {
		if c := &in.CSRs[i]; ok(c) && (best == nil || c.Created.After(best.Created)) {
			best = c
		}
	}
	return best
}

func findCSR(csrs []CSR, name string) *CSR {
	if name == "" {
		return nil
	}
	for i := range csrs {
		if csrs[i].Name == name {
			return &csrs[i]
		}
	}
	return nil
}

// requestMatchesKey reports whether the PEM request carries keyPEM's public key.
func requestMatchesKey(req, keyPEM []byte) bool {
	b, _ := pem.Decode(req)
	if b == nil {
		return false
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return false
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return false
	}
	pub, ok := csr.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(key.Public())
}

func parse(b []byte) []*x509.Certificate {
	cs, err := pki.ParseCertsPEM(b)
	if err != nil {
		return nil
	}
	return cs
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// NewKey generates the private key of a request: ECDSA P-256, PKCS#8 PEM
// (what the servers' certwatcher reads).
func NewKey() ([]byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return pki.EncodeKeyPEM(k)
}

// BuildRequest is spec.request for c signed by keyPEM: the DNS names as
// SANs and the first as CommonName.
func BuildRequest(c CreateCSR, keyPEM []byte) ([]byte, error) {
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if len(c.DNSNames) == 0 {
		return nil, fmt.Errorf("request without DNS names")
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: c.DNSNames[0]}, DNSNames: c.DNSNames,
	}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}
