package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCA is a throwaway certificate authority for test webhook servers.
type TestCA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewTestCA makes a self-signed ECDSA P-256 CA valid for 24 hours.
func NewTestCA(commonName string) (*TestCA, error) {
	return newCA(commonName, 24*time.Hour)
}

func newCA(commonName string, validity time.Duration) (*TestCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &TestCA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Serving issues a serving certificate for dnsNames and returns PEM cert and key.
func (ca *TestCA) Serving(dnsNames ...string) (certPEM, keyPEM []byte, err error) {
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsNames[0]},
		DNSNames:    dnsNames,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// issue signs tmpl (subject, SANs and extended key usage set by the
// caller) with a new P-256 key, valid as long as the CA.
func (ca *TestCA) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = randomSerial()
	tmpl.NotBefore = time.Now().Add(-time.Minute)
	tmpl.NotAfter = ca.Cert.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// WriteServing writes tls.crt, tls.key and ca.crt for dnsNames into dir, the
// layout of a kubernetes.io/tls Secret mounted as a volume.
func (ca *TestCA) WriteServing(dir string, dnsNames ...string) error {
	c, k, err := ca.Serving(dnsNames...)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": ca.CertPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// MustServiceCA is a new test CA named commonName and the serving
// certificate and key it signs for the Service ns/name (ServiceDNSNames);
// it fails t on error.
func MustServiceCA(t testing.TB, commonName, ns, name string) (ca *TestCA, certPEM, keyPEM []byte) {
	t.Helper()
	ca, err := NewTestCA(commonName)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err = ca.Serving(ServiceDNSNames(ns, name)...)
	if err != nil {
		t.Fatal(err)
	}
	return ca, certPEM, keyPEM
}

// ServiceDNSNames are the SANs a webhook server behind Service ns/name needs.
func ServiceDNSNames(namespace, name string) []string {
	return []string{
		name + "." + namespace + ".svc",
		name + "." + namespace + ".svc.cluster.local",
	}
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}
