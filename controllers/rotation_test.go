package controllers

import (
	"bytes"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hookwright/hookwright/internal/certs"
)

// world is an in-memory installation: the CA Secret, each CR's serving
// Secret and configuration caBundle, and the certificate its pods serve
// (which follows the Secret only after reloadLag, like a mounted Secret).
type world struct {
	ca       map[string][]byte
	secrets  map[string]*corev1.Secret
	bundles  map[string][]byte
	served   map[string][]byte
	changed  map[string]time.Time
	extra    []byte
	settings Settings
}

func (w *world) reconcile(t *testing.T, op Operand, now time.Time) CertState {
	t.Helper()
	in := CertInputs{
		Own: servingKey(op, w.settings), OwnConfig: op.Kind.BaseName(op.Object.GetName()),
		Extra: w.extra, Now: now, Settings: w.settings.Certificates,
		State: certs.State{CA: w.ca, Published: map[string][]byte{}, Serving: map[string]certs.Serving{}},
	}
	for _, o := range []Operand{SidecarOperand(testInjector()), OversellOperand(testOversell())} {
		k := servingKey(o, w.settings)
		sec := w.secrets[k]
		in.State.Serving[k] = servingOf(o, w.settings, sec)
		if sec != nil {
			d, _ := DrainingFromAnnotations(sec.Annotations, now)
			in.State.Draining = append(in.State.Draining, splitPEM(d)...)
		}
		if b, ok := w.bundles[o.Kind.BaseName(o.Object.GetName())]; ok {
			in.State.Published[o.Kind.BaseName(o.Object.GetName())] = PlannerView(b, w.extra, w.ca)
		}
	}
	out, err := AdvanceCertificates(in)
	if err != nil {
		t.Fatal(err)
	}
	if out.CA != nil {
		w.ca = maps.Clone(out.CA)
	}
	cs := certStateFrom(op, w.settings, out, w.secrets[in.Own], now)
	if cs.Secret != nil {
		if old := w.secrets[in.Own]; old == nil || !bytes.Equal(old.Data[corev1.TLSCertKey], cs.Secret.Data[corev1.TLSCertKey]) {
			w.changed[in.Own] = now
		}
		w.secrets[in.Own] = cs.Secret
		w.bundles[in.OwnConfig] = cs.CABundle
	}
	return cs
}

// TestRotationNoFailedAdmission drives two CRs (one of each kind) through a
// CA rotation, reconciling them in turn once per simulated second, with
// pods reloading a new serving certificate 3 s after the Secret changed.
// After every reconcile, each server's certificate must verify against
// its configuration's caBundle: no admission would fail.
func TestRotationNoFailedAdmission(t *testing.T) {
	const reloadLag = 3 * time.Second
	extraCA, err := certs.NewCA(certs.CAOptions{CommonName: "ca-dir", Clock: certs.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{
		secrets: map[string]*corev1.Secret{}, bundles: map[string][]byte{}, served: map[string][]byte{}, changed: map[string]time.Time{},
		extra: extraCA.CertPEM,
		settings: Settings{Namespace: testSettings.Namespace, Image: testSettings.Image, Certificates: CertificateSettings{
			Policy: certs.Policy{CAValidity: time.Hour, PromoteDelay: 2 * time.Second}, DrainGrace: 10 * time.Second,
		}},
	}
	ops := []Operand{SidecarOperand(testInjector()), OversellOperand(testOversell())}
	now := t0
	for range 3 {
		for _, op := range ops {
			w.reconcile(t, op, now)
		}
	}
	for k, s := range w.secrets {
		w.served[k] = s.Data[corev1.TLSCertKey]
	}
	firstCA := mustCA(t, w.ca)
	now = certs.CARotationTime(firstCA, w.settings.Certificates.Policy)
	steps := map[certs.StepKind]time.Time{}
	for i := range 120 {
		for _, op := range ops {
			cs := w.reconcile(t, op, now)
			for _, s := range cs.Steps {
				if _, ok := steps[s.Kind]; !ok {
					steps[s.Kind] = now
				}
			}
			// Pods pick up the Secret after the lag.
			for k, at := range w.changed {
				if now.Sub(at) >= reloadLag {
					w.served[k] = w.secrets[k].Data[corev1.TLSCertKey]
				}
			}
			for _, o := range ops {
				k, cfg := servingKey(o, w.settings), o.Kind.BaseName(o.Object.GetName())
				leaf, err := certs.ParseCertPEM(w.served[k])
				if err != nil {
					t.Fatal(err)
				}
				if err := certs.VerifyServing(leaf, w.bundles[cfg], certs.ServingDNSNames(cfg, ServerNamespace(o, w.settings), "")[0], now); err != nil {
					t.Fatalf("second %d: %s serves a certificate its configuration does not trust: %v", i, cfg, err)
				}
				if !certs.BundleContains(w.bundles[cfg], extraCA.Cert) {
					t.Fatalf("second %d: %s lost the ca-dir CA", i, cfg)
				}
			}
		}
		now = now.Add(time.Second)
	}
	for _, k := range []certs.StepKind{certs.StepCreateNextCA, certs.StepPublishBundle, certs.StepPromoteNextCA, certs.StepIssueServing, certs.StepDropRetiredCA} {
		if _, ok := steps[k]; !ok {
			t.Fatalf("step %s never ran; ran %v", k, steps)
		}
	}
	if !(steps[certs.StepCreateNextCA].Before(steps[certs.StepPromoteNextCA]) && steps[certs.StepPromoteNextCA].Before(steps[certs.StepDropRetiredCA])) {
		t.Fatalf("step order %v", steps)
	}
	t.Logf("steps at (from rotation due): next %s, promote %s, issue %s, drop %s",
		steps[certs.StepCreateNextCA].Sub(steps[certs.StepCreateNextCA]), steps[certs.StepPromoteNextCA].Sub(steps[certs.StepCreateNextCA]),
		steps[certs.StepIssueServing].Sub(steps[certs.StepCreateNextCA]), steps[certs.StepDropRetiredCA].Sub(steps[certs.StepCreateNextCA]))
	// Rotated: a new signing CA, the old one gone from every bundle.
	if mustCA(t, w.ca).Equal(firstCA) {
		t.Fatal("CA not rotated")
	}
	for cfg, b := range w.bundles {
		if certs.BundleContains(b, firstCA) {
			t.Fatalf("%s still trusts the old CA", cfg)
		}
		if n, _ := certs.ParseCertsPEM(b); len(n) != 2 {
			t.Fatalf("%s bundle has %d CAs, want the new CA and the ca-dir CA", cfg, len(n))
		}
	}
}

func TestPlannerView(t *testing.T) {
	own, err := NewCASecretData(t0, certs.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA(certs.CAOptions{CommonName: "other", Clock: certs.FixedClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	ownCA := mustCA(t, own)
	published := unionBundle(own[certs.SecretKeyBundle], other.CertPEM)
	// The ca-dir CA is hidden from the planner; the operator's own CA stays
	// even when the ca-dir holds it too (the mounted CA Secret).
	view := PlannerView(published, append(append([]byte{}, other.CertPEM...), own[certs.SecretKeyBundle]...), own)
	got, err := certs.ParseCertsPEM(view)
	if err != nil || len(got) != 1 || !got[0].Equal(ownCA) {
		t.Fatalf("view %d certs, err %v", len(got), err)
	}
	if v := PlannerView(published, nil, own); !bytes.Equal(v, published) {
		t.Fatal("without extra CAs the view must be the published bundle")
	}
}
