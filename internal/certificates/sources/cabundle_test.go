package sources

import (
	"bytes"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

func TestOverlapCABundle(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	grace := 5 * time.Minute
	ca := func(cn string, issued time.Time) []byte {
		kp, err := pki.NewCA(pki.CAOptions{CommonName: cn, Validity: time.Hour, Clock: pki.FixedClock(issued)})
		if err != nil {
			t.Fatal(err)
		}
		return kp.CertPEM
	}
	oldCA, newCA, newer := ca("old", now), ca("new", now), ca("newer", now)
	expired := ca("expired", now.Add(-2*time.Hour))
	foreign := ca("foreign", now)
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	has := func(bundle, c []byte) bool {
		cert, _ := pki.ParseCertPEM(c)
		return pki.BundleContains(bundle, cert)
	}
	later := now.Add(2 * time.Minute)
	for _, tc := range []struct {
		name       string
		next, live []byte
		liveUntil  time.Time
		at         time.Time
		keep       [][]byte // in the bundle besides next
		drop       [][]byte
		until      time.Time
	}{
		{name: "first publication", next: newCA, at: now},
		{name: "unchanged", next: newCA, live: newCA, at: now},
		{name: "ca.crt replaced: both", next: newCA, live: oldCA, at: now, keep: [][]byte{oldCA}, until: now.Add(grace)},
		{name: "overlap continues", next: newCA, live: cat(newCA, oldCA), liveUntil: now.Add(grace), at: later, keep: [][]byte{oldCA}, until: now.Add(grace)},
		{name: "overlap ended", next: newCA, live: cat(newCA, oldCA), liveUntil: now.Add(grace), at: now.Add(grace), drop: [][]byte{oldCA}},
		{name: "replaced again during the overlap: restarts", next: newer, live: cat(newCA, oldCA), liveUntil: now.Add(grace), at: later,
			keep: [][]byte{newCA, oldCA}, until: later.Add(grace)},
		{name: "foreign CA without an overlap is drift", next: newCA, live: cat(newCA, foreign), at: now, drop: [][]byte{foreign}},
		{name: "expired previous CA not kept", next: newCA, live: cat(oldCA, expired), at: now, keep: [][]byte{oldCA}, drop: [][]byte{expired}, until: now.Add(grace)},
		{name: "unparsable live", next: newCA, live: []byte("garbage"), at: now},
		{name: "next carries the previous CA itself", next: cat(newCA, oldCA), live: oldCA, at: now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := overlapCABundle(tc.next, tc.live, tc.liveUntil, tc.at, grace)
			if !got.Until.Equal(tc.until) {
				t.Errorf("until %s, want %s", got.Until, tc.until)
			}
			if !bytes.HasPrefix(got.Bundle, bytes.TrimRight(tc.next, "\n")) {
				t.Errorf("bundle does not start with next byte for byte")
			}
			if len(tc.keep) == 0 && !bytes.Equal(got.Bundle, tc.next) {
				t.Errorf("bundle is not next alone:\n%s", got.Bundle)
			}
			for _, k := range tc.keep {
				if !has(got.Bundle, k) {
					t.Errorf("previous CA dropped")
				}
			}
			for _, d := range tc.drop {
				if has(got.Bundle, d) {
					t.Errorf("CA kept that must go")
				}
			}
			if _, err := pki.ParseCertsPEM(got.Bundle); err != nil {
				t.Errorf("bundle does not parse: %v", err)
			}
		})
	}
	if !previousCAUntil(map[string]string{annotationPreviousCAUntil: fmtTime(now)}).Equal(now) || !previousCAUntil(nil).IsZero() ||
		!previousCAUntil(map[string]string{annotationPreviousCAUntil: "soon"}).IsZero() {
		t.Error("previousCAUntil round trip")
	}
}

// TestPublishWithoutCertificate: no bundle, nothing written; a bundle with
// no certificate issued yet (BundleOnly) updates an existing configuration
// and never creates one.
func TestPublishWithoutCertificate(t *testing.T) {
	kp, err := pki.NewCA(pki.CAOptions{CommonName: "ca"})
	if err != nil {
		t.Fatal(err)
	}
	mwc := func(bundle []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
		return &admissionregistrationv1.MutatingWebhookConfiguration{Webhooks: []admissionregistrationv1.MutatingWebhook{{ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: bundle}}}}
	}
	for _, tc := range []struct {
		name string
		st   State
		live *admissionregistrationv1.MutatingWebhookConfiguration
		want bool
	}{
		{"no bundle, no configuration", State{}, nil, false},
		{"no bundle, existing configuration", State{}, mwc([]byte("old")), false},
		{"bundle only, no configuration", State{CABundle: kp.CertPEM, BundleOnly: true}, nil, false},
		{"bundle only, existing configuration", State{CABundle: kp.CertPEM, BundleOnly: true}, mwc([]byte("old")), true},
		{"certificate, no configuration", State{CABundle: kp.CertPEM}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := mwc(nil)
			ok, _ := Publish(want, tc.live, tc.st, time.Now(), time.Minute)
			if ok != tc.want {
				t.Fatalf("Publish ok %t, want %t", ok, tc.want)
			}
			if ok && !bytes.Equal(want.Webhooks[0].ClientConfig.CABundle, kp.CertPEM) {
				t.Errorf("caBundle %q, want the state's", want.Webhooks[0].ClientConfig.CABundle)
			}
		})
	}
}
