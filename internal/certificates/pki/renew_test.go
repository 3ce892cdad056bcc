package pki

import (
	"testing"
	"time"
)

func TestRenewalTime(t *testing.T) {
	ca := mustCA(t, t0, 0)
	kp := mustServing(t, ca, t0, 90*24*time.Hour)
	life := kp.Cert.NotAfter.Sub(kp.Cert.NotBefore)
	for _, tc := range []struct {
		f    float64
		want time.Time
	}{
		{0, kp.Cert.NotBefore.Add(life * 2 / 3)},
		{2.0 / 3.0, kp.Cert.NotBefore.Add(life * 2 / 3)},
		{0.5, kp.Cert.NotBefore.Add(life / 2)},
		{1, kp.Cert.NotAfter},
		{1.5, kp.Cert.NotBefore.Add(life * 2 / 3)}, // out of range → default
		{-1, kp.Cert.NotBefore.Add(life * 2 / 3)},
	} {
		if got := RenewalTime(kp.Cert, tc.f); got.Sub(tc.want).Abs() > time.Millisecond {
			t.Errorf("f=%v: %s, want %s", tc.f, got, tc.want)
		}
	}
}

func TestServingRenewalReason(t *testing.T) {
	ca := mustCA(t, t0, 0)
	other := mustCA(t, t0, 0)
	names := ServingDNSNames("svc", "ns", "")
	good := mustServing(t, ca, t0, 90*24*time.Hour)
	fromOther := mustServing(t, other, t0, 90*24*time.Hour)
	onlyShort := mustServing(t, ca, t0, 90*24*time.Hour, names[0])
	extra := mustServing(t, ca, t0, 90*24*time.Hour, append([]string{"x.ns.svc"}, names...)...)
	future := mustServing(t, ca, t0.Add(time.Hour), 90*24*time.Hour)
	renewAt := RenewalTime(good.Cert, 0)

	for _, tc := range []struct {
		name string
		c    ServingCheck
		now  time.Time
		want string
	}{
		{"fresh", ServingCheck{CertPEM: good.CertPEM, KeyPEM: good.KeyPEM, DNSNames: names, Signer: ca.Cert}, t0, ""},
		{"SAN order irrelevant", ServingCheck{CertPEM: good.CertPEM, DNSNames: []string{names[1], names[0]}, Signer: ca.Cert}, t0, ""},
		{"no key check when key nil", ServingCheck{CertPEM: good.CertPEM, DNSNames: names, Signer: ca.Cert}, t0, ""},
		{"no chain check when signer nil", ServingCheck{CertPEM: fromOther.CertPEM, DNSNames: names}, t0, ""},
		{"1ns before renewal point", ServingCheck{CertPEM: good.CertPEM, DNSNames: names, Signer: ca.Cert}, renewAt.Add(-time.Nanosecond), ""},
		{"at renewal point", ServingCheck{CertPEM: good.CertPEM, DNSNames: names, Signer: ca.Cert}, renewAt, ReasonRenewalDue},
		{"custom fraction", ServingCheck{CertPEM: good.CertPEM, DNSNames: names, Signer: ca.Cert, RenewFraction: 0.1}, t0.Add(10 * 24 * time.Hour), ReasonRenewalDue},
		{"1ns before NotAfter", ServingCheck{CertPEM: good.CertPEM, DNSNames: names, Signer: ca.Cert}, good.Cert.NotAfter.Add(-time.Nanosecond), ReasonRenewalDue},
		{"at NotAfter", ServingCheck{CertPEM: good.CertPEM, DNSNames: names, Signer: ca.Cert}, good.Cert.NotAfter, ReasonExpired},
		{"long expired", ServingCheck{CertPEM: good.CertPEM, DNSNames: names, Signer: ca.Cert}, t0.AddDate(3, 0, 0), ReasonExpired},
		{"clock moved back", ServingCheck{CertPEM: future.CertPEM, DNSNames: names, Signer: ca.Cert}, t0.Add(-time.Hour), reasonNotYetValid},
		{"missing", ServingCheck{DNSNames: names, Signer: ca.Cert}, t0, ReasonMissing},
		{"garbage cert", ServingCheck{CertPEM: []byte("garbage"), DNSNames: names}, t0, ReasonUnparsable},
		{"truncated cert", ServingCheck{CertPEM: good.CertPEM[:40], DNSNames: names}, t0, ReasonUnparsable},
		{"garbage key", ServingCheck{CertPEM: good.CertPEM, KeyPEM: []byte("garbage"), DNSNames: names}, t0, ReasonUnparsable},
		{"empty key present", ServingCheck{CertPEM: good.CertPEM, KeyPEM: []byte{}, DNSNames: names}, t0, ReasonUnparsable},
		{"key of another cert", ServingCheck{CertPEM: good.CertPEM, KeyPEM: fromOther.KeyPEM, DNSNames: names, Signer: ca.Cert}, t0, reasonKeyMismatch},
		{"SAN missing", ServingCheck{CertPEM: onlyShort.CertPEM, DNSNames: names, Signer: ca.Cert}, t0, ReasonSANMismatch},
		{"SAN extra", ServingCheck{CertPEM: extra.CertPEM, DNSNames: names, Signer: ca.Cert}, t0, ReasonSANMismatch},
		{"service renamed", ServingCheck{CertPEM: good.CertPEM, DNSNames: ServingDNSNames("svc2", "ns", ""), Signer: ca.Cert}, t0, ReasonSANMismatch},
		{"CA cert used as serving", ServingCheck{CertPEM: ca.CertPEM, DNSNames: nil, Signer: ca.Cert}, t0, reasonUsage},
		{"other CA", ServingCheck{CertPEM: fromOther.CertPEM, KeyPEM: fromOther.KeyPEM, DNSNames: names, Signer: ca.Cert}, t0, ReasonWrongCA},
		// Severity order: a wrong CA is reported before mere expiry.
		{"other CA and expired", ServingCheck{CertPEM: fromOther.CertPEM, DNSNames: names, Signer: ca.Cert}, t0.AddDate(1, 0, 0), ReasonWrongCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, msg := ServingRenewalReason(tc.c, tc.now)
			if got != tc.want {
				t.Fatalf("reason %q (%s), want %q", got, msg, tc.want)
			}
			if (got == "") != (msg == "") {
				t.Errorf("reason %q with message %q", got, msg)
			}
		})
	}
}
