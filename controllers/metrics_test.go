package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
)

func TestCertificateMetrics(t *testing.T) {
	ca, err := pki.NewCA(pki.CAOptions{CommonName: "hookwright-ca", Clock: pki.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.NewServingCert(ca, pki.ServingOptions{DNSNames: []string{"hookwright-sidecar-mesh.hookwright-system.svc"}, Clock: pki.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	st := sources.State{CABundle: ca.CertPEM, NotAfter: leaf.Cert.NotAfter, Ready: true}
	recordCertificate("SidecarInjector", "mesh", "hookwright-system", "hookwright-sidecar-mesh-tls", st)
	if got := testutil.ToFloat64(servingNotAfter.WithLabelValues("SidecarInjector", "mesh", "hookwright-system", "hookwright-sidecar-mesh-tls")); got != float64(st.NotAfter.Unix()) {
		t.Fatalf("serving notAfter %v, want %d", got, st.NotAfter.Unix())
	}
	if got := testutil.ToFloat64(bundleNotAfter.WithLabelValues("SidecarInjector", "mesh", ca.Cert.Subject.CommonName)); got != float64(ca.Cert.NotAfter.Unix()) {
		t.Fatalf("CA notAfter %v", got)
	}
	forgetMetrics("SidecarInjector", "mesh")
	if n := testutil.CollectAndCount(servingNotAfter) + testutil.CollectAndCount(bundleNotAfter); n != 0 {
		t.Fatalf("%d series left after the CR was deleted", n)
	}
}
