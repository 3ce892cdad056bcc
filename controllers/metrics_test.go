package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hookwright/hookwright/internal/certs"
	"github.com/hookwright/hookwright/internal/certsource"
)

func TestCertificateMetrics(t *testing.T) {
	ca, err := certs.NewCA(certs.CAOptions{CommonName: "hookwright-ca", Clock: certs.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := certs.NewServingCert(ca, certs.ServingOptions{DNSNames: []string{"hookwright-sidecar-mesh.hookwright-system.svc"}, Clock: certs.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	st := certsource.State{CABundle: ca.CertPEM, NotAfter: leaf.Cert.NotAfter, Ready: true}
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
