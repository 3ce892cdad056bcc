package pki

import (
	"bytes"
	"crypto/x509"
	"slices"
	"testing"
	"time"
)

func TestTidyBundle(t *testing.T) {
	day := 24 * time.Hour
	old := mustCA(t, t0, 10*day)
	mid := mustCA(t, t0.Add(day), 400*day)
	newest := mustCA(t, t0.Add(2*day), 400*day)
	leaf := mustServing(t, mid, t0.Add(2*day), 0)
	now := t0.Add(11 * day) // old has expired

	in := []*x509.Certificate{old.Cert, mid.Cert, nil, newest.Cert, mid.Cert, leaf.Cert}
	orig := slices.Clone(in)

	got := tidyBundle(in, BundleOptions{Now: now, CAOnly: true})
	if want := []*x509.Certificate{newest.Cert, mid.Cert}; !slices.EqualFunc(got, want, (*x509.Certificate).Equal) {
		t.Errorf("got %v, want newest, mid", names(got))
	}
	if !slices.Equal(in, orig) {
		t.Error("input modified")
	}
	// Zero Now keeps expired; Max caps to the newest.
	got = tidyBundle(in, BundleOptions{Max: 2})
	// newest and leaf share NotBefore; the longer NotAfter (newest) wins the tie.
	if want := []*x509.Certificate{newest.Cert, leaf.Cert}; !slices.EqualFunc(got, want, (*x509.Certificate).Equal) {
		t.Errorf("capped: %v", names(got))
	}
	if got := tidyBundle(in, BundleOptions{Max: -1}); len(got) != 4 {
		t.Errorf("uncapped: %d", len(got))
	}
	if got := tidyBundle(in, BundleOptions{Max: 1, CAOnly: true}); len(got) != 1 || !got[0].Equal(newest.Cert) {
		t.Errorf("cap 1: %v", names(got))
	}
	// Default cap.
	var many []*x509.Certificate
	for i := range defaultMaxBundleCerts + 3 {
		many = append(many, mustCA(t, t0.Add(time.Duration(i)*time.Hour), 0).Cert)
	}
	if got := tidyBundle(many, BundleOptions{}); len(got) != defaultMaxBundleCerts || !got[0].Equal(many[len(many)-1]) {
		t.Errorf("default cap: %d certs", len(got))
	}
	// Deterministic order regardless of input order.
	a := BuildBundle([]*x509.Certificate{mid.Cert, newest.Cert}, BundleOptions{})
	b := BuildBundle([]*x509.Certificate{newest.Cert, mid.Cert, newest.Cert}, BundleOptions{})
	if !bytes.Equal(a, b) {
		t.Error("BuildBundle depends on input order or duplicates")
	}
	if BuildBundle(nil, BundleOptions{}) != nil {
		t.Error("empty bundle not nil")
	}
}

func TestMergeBundlesPEM(t *testing.T) {
	a, b := mustCA(t, t0, 0), mustCA(t, t0.Add(time.Hour), 0)
	out, errs := MergeBundlesPEM([][]byte{a.CertPEM, []byte("junk"), append(bytes.Clone(b.CertPEM), a.CertPEM...)}, BundleOptions{Now: t0})
	if len(errs) != 1 || errs[1] == nil {
		t.Errorf("errs %v", errs)
	}
	certs, err := ParseCertsPEM(out)
	if err != nil || len(certs) != 2 || !certs[0].Equal(b.Cert) || !certs[1].Equal(a.Cert) {
		t.Errorf("merged %v %v", names(certs), err)
	}
	if _, errs := MergeBundlesPEM([][]byte{a.CertPEM}, BundleOptions{}); errs != nil {
		t.Errorf("errs %v", errs)
	}
}

func TestBundleContains(t *testing.T) {
	a, b := mustCA(t, t0, 0), mustCA(t, t0, 0)
	if !BundleContains(append(bytes.Clone(b.CertPEM), a.CertPEM...), a.Cert) {
		t.Error("not found")
	}
	if BundleContains(b.CertPEM, a.Cert) || BundleContains([]byte("x"), a.Cert) || BundleContains(nil, a.Cert) {
		t.Error("false positive")
	}
}

func TestVerifyServing(t *testing.T) {
	a, b := mustCA(t, t0, 0), mustCA(t, t0, 0)
	leaf := mustServing(t, a, t0, 0)
	name := leaf.Cert.DNSNames[0]
	both := append(bytes.Clone(b.CertPEM), a.CertPEM...)
	if err := VerifyServing(leaf.Cert, both, name, t0); err != nil {
		t.Errorf("old+new bundle: %v", err)
	}
	for desc, bundle := range map[string][]byte{"other CA": b.CertPEM, "empty": nil, "garbage": []byte("x")} {
		if err := VerifyServing(leaf.Cert, bundle, name, t0); err == nil {
			t.Errorf("%s: verified", desc)
		}
	}
	if err := VerifyServing(leaf.Cert, both, name, leaf.Cert.NotAfter.Add(time.Second)); err == nil {
		t.Error("expired leaf verified")
	}
}

func names(certs []*x509.Certificate) []string {
	var out []string
	for _, c := range certs {
		out = append(out, c.Subject.CommonName+"/"+c.NotBefore.Format(time.DateTime))
	}
	return out
}
