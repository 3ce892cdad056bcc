package pki

import (
	"testing"
	"time"
)

// Rotate now: a requested CA rotation stages the next CA at once (then
// the usual publish/promote overlap follows); a rotation already staged
// satisfies it. A requested serving renewal re-issues a fine certificate.
func TestRotateAndRenewRequested(t *testing.T) {
	a := mustCA(t, t0, 365*day)
	b := mustCA(t, t0.Add(time.Hour), 365*day)
	srv := mustServing(t, a, t0, 30*day, injNames...)
	serving := map[string]Serving{"inj": {Cert: srv.CertPEM, Key: srv.KeyPEM, DNSNames: injNames}}
	now := t0.Add(2 * time.Hour)
	for _, tc := range []struct {
		name   string
		s      State
		kind   StepKind
		reason string
	}{
		{"steady", State{CA: caData(a, nil), Published: published(bundle(a.Cert), "cfg"), Serving: serving}, StepNone, reasonUpToDate},
		{"rotation requested", State{CA: caData(a, nil), Published: published(bundle(a.Cert), "cfg"), Serving: serving, RotateRequested: true}, StepCreateNextCA, reasonCARotationAsked},
		{"requested while staged: publish as usual", State{CA: caData(a, b), Published: published(bundle(a.Cert), "cfg"), Serving: serving, RotateRequested: true}, StepPublishBundle, reasonBundleOutdated},
		{"renewal requested", State{CA: caData(a, nil), Published: published(bundle(a.Cert), "cfg"),
			Serving: map[string]Serving{"inj": {Cert: srv.CertPEM, Key: srv.KeyPEM, DNSNames: injNames, RenewRequested: true}}}, StepIssueServing, ReasonRenewalRequested},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step, err := Plan(tc.s, now, Policy{})
			if err != nil {
				t.Fatal(err)
			}
			if step.Kind != tc.kind || step.Reason != tc.reason {
				t.Fatalf("got %s (%s): %s; want %s (%s)", step.Kind, step.Reason, step.Message, tc.kind, tc.reason)
			}
		})
	}
}
