package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func mustCA(t testing.TB, at time.Time, validity time.Duration) *KeyPair {
	t.Helper()
	ca, err := NewCA(CAOptions{Validity: validity, Clock: FixedClock(at)})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustServing(t testing.TB, ca *KeyPair, at time.Time, validity time.Duration, names ...string) *KeyPair {
	t.Helper()
	if len(names) == 0 {
		names = ServingDNSNames("svc", "ns", "")
	}
	kp, err := NewServingCert(ca, ServingOptions{DNSNames: names, Validity: validity, Clock: FixedClock(at)})
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func TestNewCADefaults(t *testing.T) {
	ca := mustCA(t, t0, 0)
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("basic constraints: IsCA=%v valid=%v maxPath=%d zero=%v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Error("CA lacks certSign")
	}
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", c.PublicKey)
	}
	if got, want := c.NotBefore, t0.Add(-Backdate); !got.Equal(want) {
		t.Errorf("NotBefore %s, want %s", got, want)
	}
	if got, want := c.NotAfter, t0.Add(defaultCAValidity); !got.Equal(want) {
		t.Errorf("NotAfter %s, want %s", got, want)
	}
	if want := "hookwright-ca@"; !bytes.HasPrefix([]byte(c.Subject.CommonName), []byte(want)) {
		t.Errorf("CN %q", c.Subject.CommonName)
	}
	if len(c.SubjectKeyId) == 0 {
		t.Error("no SubjectKeyId")
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	rt, err := ParseKeyPair(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatalf("round trip: %v", err)
	}
	if !rt.Cert.Equal(c) {
		t.Error("round trip changed the certificate")
	}
}

func TestNewServingCert(t *testing.T) {
	ca := mustCA(t, t0, 0)
	kp, err := NewServingCert(ca, ServingOptions{Service: "hw-injector", Namespace: "hookwright-system", Clock: FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	c := kp.Cert
	want := []string{"hw-injector.hookwright-system.svc", "hw-injector.hookwright-system.svc.cluster.local"}
	if !slices.Equal(c.DNSNames, want) {
		t.Errorf("SANs %v, want %v", c.DNSNames, want)
	}
	if c.IsCA || !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("IsCA=%v EKU=%v", c.IsCA, c.ExtKeyUsage)
	}
	if got := c.NotAfter.Sub(t0); got != DefaultServingValidity {
		t.Errorf("validity %s, want %s", got, DefaultServingValidity)
	}
	for _, name := range want {
		if err := VerifyServing(c, ca.CertPEM, name, t0); err != nil {
			t.Errorf("verify %s: %v", name, err)
		}
	}
	if err := VerifyServing(c, ca.CertPEM, "other.ns.svc", t0); err == nil {
		t.Error("verified for a name not in the SANs")
	}
	// What certwatcher does with the files.
	if _, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM); err != nil {
		t.Errorf("tls.X509KeyPair: %v", err)
	}
}

func TestServingCertCappedAtCANotAfter(t *testing.T) {
	ca := mustCA(t, t0, 30*24*time.Hour)
	kp := mustServing(t, ca, t0.Add(10*24*time.Hour), 90*24*time.Hour)
	if !kp.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter %s, want CA's %s", kp.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if _, err := NewServingCert(ca, ServingOptions{Service: "s", Namespace: "n", Clock: FixedClock(ca.Cert.NotAfter)}); err == nil {
		t.Error("issued from an expired CA")
	}
}

func TestNewServingCertErrors(t *testing.T) {
	ca := mustCA(t, t0, 0)
	leaf := mustServing(t, ca, t0, 0)
	for name, tc := range map[string]struct {
		ca *KeyPair
		o  ServingOptions
	}{
		"nil CA":          {nil, ServingOptions{Service: "s", Namespace: "n"}},
		"leaf as CA":      {leaf, ServingOptions{Service: "s", Namespace: "n"}},
		"no names":        {ca, ServingOptions{}},
		"service only":    {ca, ServingOptions{Service: "s"}},
		"namespace only":  {ca, ServingOptions{Namespace: "n"}},
		"CA without key":  {&KeyPair{Cert: ca.Cert}, ServingOptions{Service: "s", Namespace: "n"}},
		"CA without cert": {&KeyPair{Key: ca.Key}, ServingOptions{Service: "s", Namespace: "n"}},
	} {
		if _, err := NewServingCert(tc.ca, tc.o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestServingDNSNames(t *testing.T) {
	for _, tc := range []struct {
		domain string
		want   string
	}{{"", "a.b.svc.cluster.local"}, {"corp.example", "a.b.svc.corp.example"}, {"corp.example.", "a.b.svc.corp.example"}} {
		got := ServingDNSNames("a", "b", tc.domain)
		if !slices.Equal(got, []string{"a.b.svc", tc.want}) {
			t.Errorf("domain %q: %v", tc.domain, got)
		}
	}
}

func TestParseCertsPEM(t *testing.T) {
	a, b := mustCA(t, t0, 0), mustCA(t, t0.Add(time.Hour), 0)
	key := a.KeyPEM
	bad := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})
	truncated := a.CertPEM[:len(a.CertPEM)/2]
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

	for _, tc := range []struct {
		name    string
		in      []byte
		want    int
		wantErr error
	}{
		{"one", a.CertPEM, 1, nil},
		{"two", cat(a.CertPEM, b.CertPEM), 2, nil},
		{"with key and junk between", cat([]byte("# comment\n"), a.CertPEM, key, []byte("junk\n"), b.CertPEM), 2, nil},
		{"CRLF", bytes.ReplaceAll(cat(a.CertPEM, b.CertPEM), []byte("\n"), []byte("\r\n")), 2, nil},
		{"empty", nil, 0, errNoPEM},
		{"garbage", []byte("hello"), 0, errNoPEM},
		{"truncated", truncated, 0, errNoPEM},
		{"key only", key, 0, errNoCert},
		{"bad DER", bad, 0, nil},
		{"good then bad DER", cat(a.CertPEM, bad), 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certs, err := ParseCertsPEM(tc.in)
			if tc.want > 0 {
				if err != nil || len(certs) != tc.want {
					t.Fatalf("got %d certs, err %v; want %d", len(certs), err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, %d certs", len(certs))
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestParseKeyPEMAndPair(t *testing.T) {
	ca := mustCA(t, t0, 0)
	other := mustCA(t, t0, 0)
	sec1DER, err := x509.MarshalECPrivateKey(ca.Key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	sec1 := pem.EncodeToMemory(&pem.Block{Type: pemTypeECKey, Bytes: sec1DER})
	if _, err := ParseKeyPair(ca.CertPEM, sec1); err != nil {
		t.Errorf("SEC 1 key: %v", err)
	}
	if _, err := ParseKeyPair(ca.CertPEM, other.KeyPEM); !errors.Is(err, errKeyMismatch) {
		t.Errorf("mismatch: %v", err)
	}
	for name, in := range map[string][]byte{
		"empty":     nil,
		"cert only": ca.CertPEM,
		"bad pkcs8": pem.EncodeToMemory(&pem.Block{Type: pemTypePrivateKey, Bytes: []byte{1, 2, 3}}),
		"bad sec1":  pem.EncodeToMemory(&pem.Block{Type: pemTypeECKey, Bytes: []byte{1, 2, 3}}),
	} {
		if _, err := ParseKeyPEM(in); err == nil {
			t.Errorf("%s: no error", name)
		}
		if _, err := ParseKeyPair(ca.CertPEM, in); err == nil {
			t.Errorf("pair %s: no error", name)
		}
	}
	if _, err := ParseKeyPair([]byte("x"), ca.KeyPEM); err == nil {
		t.Error("bad cert: no error")
	}
}

func TestSignedBy(t *testing.T) {
	a, b := mustCA(t, t0, 0), mustCA(t, t0, 0)
	leaf := mustServing(t, a, t0, 0)
	if !SignedBy(leaf.Cert, a.Cert) || SignedBy(leaf.Cert, b.Cert) {
		t.Error("SignedBy wrong")
	}
	// Same subject, different key: the name matches, the signature does not.
	twin, err := NewCA(CAOptions{CommonName: a.Cert.Subject.CommonName, Clock: FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	if SignedBy(leaf.Cert, twin.Cert) {
		t.Error("twin subject accepted")
	}
	if SignedBy(nil, a.Cert) || SignedBy(leaf.Cert, nil) {
		t.Error("nil accepted")
	}
}

func TestClocks(t *testing.T) {
	if !FixedClock(t0).Now().Equal(t0) {
		t.Error("FixedClock")
	}
	if d := time.Since(RealClock.Now()); d < 0 || d > time.Minute {
		t.Errorf("RealClock off by %s", d)
	}
}

// The memos of checks and parses change nothing but time: the same
// answers the second time, a failed parse or a key that does not fit
// is never remembered as a success, and a caller's append to a parsed
// list is not seen by the next caller.
func TestMemosAnswerAsWithout(t *testing.T) {
	ca, other := mustCA(t, t0, 365*24*time.Hour), mustCA(t, t0, 365*24*time.Hour)
	srv := mustServing(t, ca, t0, 24*time.Hour, "a.svc")
	for range 2 {
		if !SignedBy(srv.Cert, ca.Cert) || SignedBy(srv.Cert, other.Cert) || SignedBy(ca.Cert, srv.Cert) {
			t.Fatal("SignedBy answered otherwise the second time")
		}
		if r, _ := keyFits(srv.Cert, srv.KeyPEM); r != "" {
			t.Fatalf("the serving key does not fit: %s", r)
		}
		if r, _ := keyFits(srv.Cert, ca.KeyPEM); r != reasonKeyMismatch {
			t.Fatalf("another key: %q, want %s", r, reasonKeyMismatch)
		}
		if r, _ := keyFits(srv.Cert, []byte("garbage")); r != ReasonUnparsable {
			t.Fatalf("garbage key: %q, want %s", r, ReasonUnparsable)
		}
		if _, err := ParseCertsPEM(append(slices.Clone(ca.CertPEM), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")...)); err == nil {
			t.Fatal("a bundle with a bad entry parsed")
		}
	}
	pair := append(slices.Clone(ca.CertPEM), other.CertPEM...)
	first, err := ParseCertsPEM(pair)
	if err != nil || len(first) != 2 {
		t.Fatalf("parse: %v, %d certificates", err, len(first))
	}
	_ = append(first[:1], srv.Cert)
	again, err := ParseCertsPEM(pair)
	if err != nil || len(again) != 2 || !again[0].Equal(ca.Cert) || !again[1].Equal(other.Cert) {
		t.Fatalf("second parse: %v, %v", err, again)
	}
	// Emptied when full, and still right.
	for i := range checkMemoSize + 1 {
		checks.put(pairKey([]byte{byte(i), byte(i >> 8)}, nil), false)
	}
	if !SignedBy(srv.Cert, ca.Cert) || len(checks.m) > checkMemoSize {
		t.Fatalf("after the memo filled: %d entries", len(checks.m))
	}
}
