package csrsign

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

func csrPEM(t *testing.T, key crypto.Signer, tmpl x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func ecKey(t *testing.T, c elliptic.Curve) crypto.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var serving = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}

func testPolicy() Policy {
	return Policy{
		Namespaces: []string{"hookwright-system", "mesh"},
		Services: map[string]Service{
			"hookwright-system/hw-sidecar": {ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.10")}},
			"mesh/hw-oversell":             {},
		},
		MaxValidity: 24 * time.Hour,
	}
}

func TestCheck(t *testing.T) {
	p := testPolicy()
	key := ecKey(t, elliptic.P256())
	name := "hw-sidecar.hookwright-system.svc"
	good := x509.CertificateRequest{DNSNames: []string{name, name + ".cluster.local"}}
	rsaSmall, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	u, _ := url.Parse("spiffe://cluster.local/ns/x/sa/y")
	bad := csrPEM(t, key, good)
	bad[len(bad)/2] ^= 1
	for _, tc := range []struct {
		name   string
		key    crypto.Signer
		tmpl   x509.CertificateRequest
		pem    []byte
		usages []certificatesv1.KeyUsage
		exp    *int32
		reason string // "" means signed
		names  []string
		ips    []string
		valid  time.Duration
	}{
		{name: "serving", tmpl: good, usages: serving, names: good.DNSNames, valid: 24 * time.Hour},
		{name: "key encipherment and CN", tmpl: x509.CertificateRequest{Subject: pkix.Name{CommonName: name}, DNSNames: []string{name}},
			usages: append(slices.Clone(serving), certificatesv1.UsageKeyEncipherment), names: []string{name}, valid: 24 * time.Hour},
		{name: "ClusterIP", tmpl: x509.CertificateRequest{DNSNames: []string{name}, IPAddresses: []net.IP{net.ParseIP("10.0.0.10")}},
			usages: serving, names: []string{name}, ips: []string{"10.0.0.10"}, valid: 24 * time.Hour},
		{name: "expirationSeconds", tmpl: good, usages: serving, exp: ptr.To[int32](3600), names: good.DNSNames, valid: time.Hour},
		{name: "ed25519", key: edKey, tmpl: good, usages: serving, names: good.DNSNames, valid: 24 * time.Hour},
		{name: "second namespace", tmpl: x509.CertificateRequest{DNSNames: []string{"hw-oversell.mesh.svc"}}, usages: serving,
			names: []string{"hw-oversell.mesh.svc"}, valid: 24 * time.Hour},

		{name: "client auth", tmpl: good, usages: append(slices.Clone(serving), certificatesv1.UsageClientAuth), reason: ReasonForbiddenUsage},
		{name: "client auth only", tmpl: good, usages: []certificatesv1.KeyUsage{certificatesv1.UsageClientAuth}, reason: ReasonForbiddenUsage},
		{name: "cert sign", tmpl: good, usages: append(slices.Clone(serving), certificatesv1.UsageCertSign), reason: ReasonForbiddenUsage},
		{name: "no server auth", tmpl: good, usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}, reason: ReasonForbiddenUsage},
		{name: "no usages", tmpl: good, reason: ReasonForbiddenUsage},
		{name: "organization", tmpl: x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"system:masters"}}, DNSNames: []string{name}},
			usages: serving, reason: ReasonForbiddenSubject},
		{name: "foreign CN", tmpl: x509.CertificateRequest{Subject: pkix.Name{CommonName: "kubernetes"}, DNSNames: []string{name}},
			usages: serving, reason: ReasonForbiddenSubject},
		{name: "no DNS name", tmpl: x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, usages: serving, reason: ReasonForbiddenName},
		{name: "not a Service name", tmpl: x509.CertificateRequest{DNSNames: []string{"www.example.com"}}, usages: serving, reason: ReasonForbiddenName},
		{name: "kubernetes.default", tmpl: x509.CertificateRequest{DNSNames: []string{"kubernetes.default"}}, usages: serving, reason: ReasonForbiddenName},
		{name: "wildcard", tmpl: x509.CertificateRequest{DNSNames: []string{"*.hookwright-system.svc"}}, usages: serving, reason: ReasonForbiddenName},
		{name: "other cluster domain", tmpl: x509.CertificateRequest{DNSNames: []string{name + ".evil.example"}}, usages: serving, reason: ReasonForbiddenName},
		{name: "email", tmpl: x509.CertificateRequest{DNSNames: []string{name}, EmailAddresses: []string{"a@b.c"}}, usages: serving, reason: ReasonForbiddenName},
		{name: "URI", tmpl: x509.CertificateRequest{DNSNames: []string{name}, URIs: []*url.URL{u}}, usages: serving, reason: ReasonForbiddenName},
		{name: "namespace not allowed", tmpl: x509.CertificateRequest{DNSNames: []string{"kubernetes.default.svc"}}, usages: serving, reason: ReasonNamespaceNotAllowed},
		{name: "one name of a foreign namespace", tmpl: x509.CertificateRequest{DNSNames: []string{name, "api.kube-system.svc"}}, usages: serving, reason: ReasonNamespaceNotAllowed},
		{name: "no such Service", tmpl: x509.CertificateRequest{DNSNames: []string{"other.hookwright-system.svc"}}, usages: serving, reason: ReasonServiceNotFound},
		{name: "IP outside the Service range", tmpl: x509.CertificateRequest{DNSNames: []string{name}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}},
			usages: serving, reason: ReasonForbiddenIP},
		{name: "IP of another Service", tmpl: x509.CertificateRequest{DNSNames: []string{name}, IPAddresses: []net.IP{net.ParseIP("10.0.0.11")}},
			usages: serving, reason: ReasonForbiddenIP},
		{name: "too long", tmpl: good, usages: serving, exp: ptr.To[int32](2 * 86400), reason: ReasonLifetimeTooLong},
		{name: "RSA 1024", key: rsaSmall, tmpl: good, usages: serving, reason: reasonWeakKey},
		{name: "P-224", key: ecKey(t, elliptic.P224()), tmpl: good, usages: serving, reason: reasonWeakKey},
		{name: "not PEM", pem: []byte("hello"), usages: serving, reason: reasonBadRequest},
		{name: "broken signature", pem: bad, usages: serving, reason: reasonBadRequest},
		{name: "two requests", pem: append(csrPEM(t, key, good), csrPEM(t, key, good)...), usages: serving, reason: reasonBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.key
			if k == nil {
				k = key
			}
			data := tc.pem
			if data == nil {
				data = csrPEM(t, k, tc.tmpl)
			}
			g, err := Check(p, Request{PEM: data, Usages: tc.usages, ExpirationSeconds: tc.exp})
			if tc.reason != "" {
				var r *Refusal
				if !errors.As(err, &r) || r.Reason != tc.reason {
					t.Fatalf("got %v, want refusal %s", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(g.DNSNames, tc.names) || g.Validity != tc.valid {
				t.Fatalf("grant names %v validity %s, want %v %s", g.DNSNames, g.Validity, tc.names, tc.valid)
			}
			var ips []string
			for _, a := range g.IPs {
				ips = append(ips, a.String())
			}
			if !slices.Equal(ips, tc.ips) {
				t.Fatalf("IPs %v, want %v", ips, tc.ips)
			}
		})
	}
}

func TestServiceRef(t *testing.T) {
	for _, tc := range []struct{ in, ns, name string }{
		{"a.b.svc", "b", "a"},
		{"a.b.svc.cluster.local", "b", "a"},
		{"a.b.svc.other.local", "", ""},
		{"a.svc", "", ""},
		{"a.b.c.svc", "", ""},
		{"A.b.svc", "", ""},
	} {
		ns, name, ok := serviceRef(tc.in, "")
		if ok != (tc.ns != "") || ns != tc.ns || name != tc.name {
			t.Errorf("ServiceRef(%q) = %q %q %v", tc.in, ns, name, ok)
		}
	}
	if keys := ServiceKeys(csrPEM(t, ecKey(t, elliptic.P256()), x509.CertificateRequest{DNSNames: []string{"a.b.svc", "a.b.svc.cluster.local", "c.d.svc", "x.example"}}), ""); !slices.Equal(keys, []string{"b/a", "d/c"}) {
		t.Errorf("ServiceKeys = %v", keys)
	}
}

func TestSign(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ca, err := pki.NewCA(pki.CAOptions{Clock: pki.FixedClock(now), Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	p := testPolicy()
	p.MaxValidity = 72 * time.Hour
	name := "hw-sidecar.hookwright-system.svc"
	g, err := Check(p, Request{PEM: csrPEM(t, ecKey(t, elliptic.P256()), x509.CertificateRequest{DNSNames: []string{name}, IPAddresses: []net.IP{net.ParseIP("10.0.0.10")}}), Usages: serving})
	if err != nil {
		t.Fatal(err)
	}
	out, err := Sign(ca, g, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.ParseCertPEM(out)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := c.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("a client certificate was issued")
	}
	// Capped at the CA's NotAfter, backdated like the operator's own.
	if !c.NotAfter.Equal(ca.Cert.NotAfter) || c.IsCA || !c.NotBefore.Equal(now.Add(-pki.Backdate)) {
		t.Fatalf("NotBefore %s NotAfter %s (CA %s) IsCA %v", c.NotBefore, c.NotAfter, ca.Cert.NotAfter, c.IsCA)
	}
	if len(c.IPAddresses) != 1 || !c.IPAddresses[0].Equal(net.ParseIP("10.0.0.10")) {
		t.Fatalf("IPs %v", c.IPAddresses)
	}
	if _, err := Sign(ca, g, now.Add(49*time.Hour), nil); err == nil {
		t.Fatal("signed with an expired CA")
	}
}
