// Package pki generates and checks the keys and certificates behind
// hookwright's admission webhooks, as pure functions: a self-signed CA per installation, serving certificates
// for each webhook Service, caBundle assembly, and a pure state machine
// (Plan/Apply) that rotates the CA without a failed admission.
//
// Nothing here talks to the API server or reads the wall clock directly:
// callers pass a Clock or a time, so every decision is reproducible in tests.
//
// Defaults (see the Default* constants): ECDSA P-256 keys, CA valid 5 years
// and rotated at 2/3 of its lifetime (or 180 days before expiry, whichever is
// earlier), serving certificates valid 90 days and renewed at 2/3 of their
// lifetime (day 60).
//
// It must not import any other hookwright package, nor a Kubernetes client.
// The other packages of internal/certificates build on it.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"
)

// Defaults. Durations are wall-clock lengths of validity.
const (
	// defaultCAValidity is the CA lifetime: long enough that rotation is a rare
	// event, short enough that a leaked key ages out (knative uses 7 days,
	// OPA cert-controller 10 years; 5 years sits between with rotation tested).
	defaultCAValidity = 5 * 365 * 24 * time.Hour
	// DefaultServingValidity is the serving certificate lifetime (cert-manager's default).
	DefaultServingValidity = 90 * 24 * time.Hour
	// defaultRenewFraction is the elapsed fraction of a certificate's lifetime
	// after which it is renewed (cert-manager renews at 2/3).
	defaultRenewFraction = 2.0 / 3.0
	// defaultCALookahead rotates the CA at the latest this long before it
	// expires, so a serving certificate issued just before rotation never
	// outlives its CA by much (serving certs are also capped at the CA's NotAfter).
	defaultCALookahead = 180 * 24 * time.Hour
	// DefaultClusterDomain is the cluster DNS suffix used for the long SAN.
	DefaultClusterDomain = "cluster.local"
	// defaultCACommonName prefixes the CA subject; a "@<unix seconds>" suffix
	// keeps successive CAs distinguishable in logs and chain building.
	defaultCACommonName = "hookwright-ca"
	// Backdate moves NotBefore into the past to tolerate clock skew between
	// the operator, the API servers and the webhook pods.
	Backdate = 5 * time.Minute
)

// PEM block types written and accepted.
const (
	pemTypeCertificate = "CERTIFICATE"
	pemTypePrivateKey  = "PRIVATE KEY"    // PKCS#8, written
	pemTypeECKey       = "EC PRIVATE KEY" // SEC 1, accepted on read
)

// Clock is the time source used when generating certificates.
// k8s.io/utils/clock.Clock satisfies it.
type Clock interface {
	Now() time.Time
}

// ClockFunc adapts a function to Clock.
type ClockFunc func() time.Time

// Now returns f().
func (f ClockFunc) Now() time.Time { return f() }

// RealClock reads the system clock.
var RealClock Clock = ClockFunc(time.Now)

// FixedClock always returns t (tests).
func FixedClock(t time.Time) Clock { return ClockFunc(func() time.Time { return t }) }

// KeyPair is a certificate with its private key, parsed and PEM-encoded.
type KeyPair struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte // one CERTIFICATE block
	KeyPEM  []byte // one PRIVATE KEY (PKCS#8) block
}

// Errors returned by the parsers; wrap with fmt.Errorf("%w") context.
var (
	errNoPEM       = errors.New("no PEM data")
	errNoCert      = errors.New("no CERTIFICATE block")
	errKeyMismatch = errors.New("private key does not match certificate public key")
	errNotCA       = errors.New("certificate is not a CA")
)

// CAOptions configure NewCA. Zero values take the defaults.
type CAOptions struct {
	CommonName string        // default defaultCACommonName + "@<unix>"
	Validity   time.Duration // default defaultCAValidity
	Clock      Clock         // default RealClock
	Rand       io.Reader     // default crypto/rand.Reader
}

// NewCA generates a self-signed ECDSA P-256 CA valid from now-Backdate for
// Validity. The CA may sign leaf certificates only (MaxPathLen 0).
func NewCA(o CAOptions) (*KeyPair, error) {
	clk, rnd := orClock(o.Clock), orRand(o.Rand)
	validity := o.Validity
	if validity <= 0 {
		validity = defaultCAValidity
	}
	now := clk.Now()
	cn := o.CommonName
	if cn == "" {
		cn = fmt.Sprintf("%s@%d", defaultCACommonName, now.Unix())
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial(rnd)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-Backdate).UTC(),
		NotAfter:              now.Add(validity).UTC(),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rnd, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("sign CA: %w", err)
	}
	return newKeyPair(der, key)
}

// ServingOptions configure NewServingCert. Either DNSNames, or Service and
// Namespace (expanded by ServingDNSNames), must be set.
type ServingOptions struct {
	Service       string
	Namespace     string
	ClusterDomain string        // default DefaultClusterDomain
	DNSNames      []string      // overrides Service/Namespace when non-empty
	Validity      time.Duration // default DefaultServingValidity; capped at the CA's NotAfter
	Clock         Clock         // default RealClock
	Rand          io.Reader     // default crypto/rand.Reader
}

// ServingDNSNames returns the SANs a webhook Service is reached by:
// "<svc>.<ns>.svc" (what the API server dials) and
// "<svc>.<ns>.svc.<clusterDomain>" (clusterDomain "" means DefaultClusterDomain).
func ServingDNSNames(service, namespace, clusterDomain string) []string {
	if clusterDomain == "" {
		clusterDomain = DefaultClusterDomain
	}
	base := service + "." + namespace + ".svc"
	return []string{base, base + "." + strings.TrimSuffix(clusterDomain, ".")}
}

// NewServingCert issues an ECDSA P-256 serverAuth certificate signed by ca.
// NotAfter is capped at ca's NotAfter, because a leaf that outlives its CA
// fails verification anyway.
func NewServingCert(ca *KeyPair, o ServingOptions) (*KeyPair, error) {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return nil, errors.New("serving cert: nil CA")
	}
	if !ca.Cert.IsCA {
		return nil, fmt.Errorf("serving cert: %w", errNotCA)
	}
	names := o.DNSNames
	if len(names) == 0 {
		if o.Service == "" || o.Namespace == "" {
			return nil, errors.New("serving cert: need DNSNames or Service and Namespace")
		}
		names = ServingDNSNames(o.Service, o.Namespace, o.ClusterDomain)
	}
	clk, rnd := orClock(o.Clock), orRand(o.Rand)
	validity := o.Validity
	if validity <= 0 {
		validity = DefaultServingValidity
	}
	now := clk.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	notBefore := now.Add(-Backdate)
	if notBefore.Before(ca.Cert.NotBefore) {
		notBefore = ca.Cert.NotBefore
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("serving cert: CA %q expired at %s", ca.Cert.Subject.CommonName, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	serial, err := newSerial(rnd)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: names[0]},
		DNSNames:              append([]string(nil), names...),
		NotBefore:             notBefore.UTC(),
		NotAfter:              notAfter.UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rnd, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign serving cert: %w", err)
	}
	return newKeyPair(der, key)
}

// EncodeCertPEM returns cert as one CERTIFICATE block.
func EncodeCertPEM(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemTypeCertificate, Bytes: cert.Raw})
}

// EncodeCertsPEM concatenates CERTIFICATE blocks in the given order.
func EncodeCertsPEM(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, EncodeCertPEM(c)...)
	}
	return out
}

// EncodeKeyPEM returns key as a PKCS#8 PRIVATE KEY block (what tls.X509KeyPair
// and certwatcher read).
func EncodeKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemTypePrivateKey, Bytes: der}), nil
}

// ParseCertsPEM parses every CERTIFICATE block in data, in order. Other block
// types are skipped. It fails on data with no PEM at all (errNoPEM), with no
// CERTIFICATE block (errNoCert), or on any CERTIFICATE block that does not
// parse; a bundle with one bad entry is rejected rather than silently
// shortened.
//
// The certificates are shared with other callers that parsed the same
// bytes (parsed, a memo: a reconcile parses every CR's serving
// certificate and published bundle again), so they must not be modified.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	k := sha256.Sum256(data)
	if certs := parsed.get(k); certs != nil {
		return slices.Clone(certs), nil
	}
	certs, err := parseCertsPEM(data)
	if err == nil {
		parsed.put(k, slices.Clone(certs))
	}
	return certs, err
}

// parsed remembers ParseCertsPEM's results by the SHA-256 of its input,
// emptied when it holds parsedMemoSize.
var parsed = &parseMemo{m: map[[sha256.Size]byte][]*x509.Certificate{}}

const parsedMemoSize = 1024

type parseMemo struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte][]*x509.Certificate
}

func (p *parseMemo) get(k [sha256.Size]byte) []*x509.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[k]
}

func (p *parseMemo) put(k [sha256.Size]byte, certs []*x509.Certificate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) >= parsedMemoSize {
		clear(p.m)
	}
	p.m[k] = certs
}

func parseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	sawPEM := false
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		sawPEM = true
		if b.Type != pemTypeCertificate {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if !sawPEM {
		return nil, errNoPEM
	}
	if len(certs) == 0 {
		return nil, errNoCert
	}
	return certs, nil
}

// ParseCertPEM parses exactly the first CERTIFICATE in data.
func ParseCertPEM(data []byte) (*x509.Certificate, error) {
	certs, err := ParseCertsPEM(data)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// ParseKeyPEM parses the first private key block (PKCS#8 or SEC 1 EC) in data.
func ParseKeyPEM(data []byte) (crypto.Signer, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errNoPEM
		}
		switch b.Type {
		case pemTypePrivateKey:
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse PKCS#8 key: %w", err)
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("key type %T cannot sign", k)
			}
			return s, nil
		case pemTypeECKey:
			k, err := x509.ParseECPrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse EC key: %w", err)
			}
			return k, nil
		}
	}
}

// ParseKeyPair parses a certificate (first block of certPEM) and its key and
// checks they belong together (errKeyMismatch otherwise).
func ParseKeyPair(certPEM, keyPEM []byte) (*KeyPair, error) {
	cert, err := ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	key, err := ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	if !keyMatches(cert, key) {
		return nil, errKeyMismatch
	}
	return &KeyPair{Cert: cert, Key: key, CertPEM: EncodeCertPEM(cert), KeyPEM: bytesClone(keyPEM)}, nil
}

// keyMatches reports whether key is the private half of cert's public key.
func keyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && key != nil && pub.Equal(key.Public())
}

// SignedBy reports whether cert was issued and signed by ca. It does not look
// at validity periods, so it answers "which CA does this chain to" even for
// expired certificates.
func SignedBy(cert, ca *x509.Certificate) bool {
	if cert == nil || ca == nil || string(cert.RawIssuer) != string(ca.RawSubject) {
		return false
	}
	k := pairKey(cert.Raw, ca.Raw)
	if ok, seen := checks.get(k); seen {
		return ok
	}
	ok := cert.CheckSignatureFrom(ca) == nil
	checks.put(k, ok)
	return ok
}

// checks remembers the answers of the checks a reconcile repeats on the
// same certificates (a signature, a key matching a certificate: each an
// ECDSA operation of about 60 µs, where the two SHA-256 of the key cost
// about 2 µs). Plan checks every serving certificate of a CA on every
// reconcile of every CR that shares it. The answers are functions of the
// bytes hashed, so the memo is invisible but for time; it is emptied when
// it holds checkMemoSize answers.
var checks = &checkMemo{m: map[[2 * sha256.Size]byte]bool{}}

const checkMemoSize = 4096

type checkMemo struct {
	mu sync.Mutex
	m  map[[2 * sha256.Size]byte]bool
}

func (c *checkMemo) get(k [2 * sha256.Size]byte) (ok, seen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok, seen = c.m[k]
	return ok, seen
}

func (c *checkMemo) put(k [2 * sha256.Size]byte, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= checkMemoSize {
		clear(c.m)
	}
	c.m[k] = ok
}

// pairKey is the memo key of a check on a and b.
func pairKey(a, b []byte) [2 * sha256.Size]byte {
	var k [2 * sha256.Size]byte
	x, y := sha256.Sum256(a), sha256.Sum256(b)
	copy(k[:sha256.Size], x[:])
	copy(k[sha256.Size:], y[:])
	return k
}

func newKeyPair(der []byte, key crypto.Signer) (*KeyPair, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse generated certificate: %w", err)
	}
	keyPEM, err := EncodeKeyPEM(key)
	if err != nil {
		return nil, err
	}
	return &KeyPair{Cert: cert, Key: key, CertPEM: EncodeCertPEM(cert), KeyPEM: keyPEM}, nil
}

func newSerial(rnd io.Reader) (*big.Int, error) {
	// 128 random bits: unique per CA without keeping a counter.
	s, err := rand.Int(rnd, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func orClock(c Clock) Clock {
	if c == nil {
		return RealClock
	}
	return c
}

func orRand(r io.Reader) io.Reader {
	if r == nil {
		return rand.Reader
	}
	return r
}

func bytesClone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
