package csrsign

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// Sign issues g's certificate from ca at now: subject CommonName the first
// DNS name, serverAuth only, not a CA, NotBefore backdated by
// pki.Backdate (never before the CA's), NotAfter now+g.Validity capped at
// the CA's NotAfter. It returns the certificate as PEM (what goes into
// status.certificate). rnd nil means crypto/rand.
func Sign(ca *pki.KeyPair, g Grant, now time.Time, rnd io.Reader) ([]byte, error) {
	if ca == nil || ca.Cert == nil || ca.Key == nil || !ca.Cert.IsCA {
		return nil, errors.New("sign: no usable CA")
	}
	if g.CSR == nil || len(g.DNSNames) == 0 {
		return nil, errors.New("sign: empty grant")
	}
	if rnd == nil {
		rnd = rand.Reader
	}
	notAfter := now.Add(g.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("sign: CA %q expired at %s", ca.Cert.Subject.CommonName, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	notBefore := now.Add(-pki.Backdate)
	if notBefore.Before(ca.Cert.NotBefore) {
		notBefore = ca.Cert.NotBefore
	}
	serial, err := rand.Int(rnd, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("sign: serial: %w", err)
	}
	ips := make([]net.IP, 0, len(g.IPs))
	for _, a := range g.IPs {
		ips = append(ips, net.IP(a.AsSlice()))
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial.Add(serial, big.NewInt(1)),
		Subject:               pkix.Name{CommonName: g.DNSNames[0]},
		DNSNames:              g.DNSNames,
		IPAddresses:           ips,
		NotBefore:             notBefore.UTC(),
		NotAfter:              notAfter.UTC(),
		KeyUsage:              g.KeyUsage,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rnd, tmpl, ca.Cert, g.CSR.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("sign: parse issued certificate: %w", err)
	}
	return pki.EncodeCertPEM(c), nil
}
