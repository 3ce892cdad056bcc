package csrplan

import (
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hookwright/hookwright/internal/certificates/csrsign"
	"github.com/hookwright/hookwright/internal/certificates/pki"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

type fixture struct {
	t    *testing.T
	spec Spec
	ca   *pki.KeyPair
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return &fixture{t: t, spec: Spec{SignerName: "hookwright.io/webhook-serving", DNSNames: pki.ServingDNSNames("hw", "ns", "")}, ca: newCA(t, "ca-1")}
}

func newCA(t *testing.T, cn string) *pki.KeyPair {
	t.Helper()
	ca, err := pki.NewCA(pki.CAOptions{CommonName: cn, Clock: pki.FixedClock(t0.Add(-time.Hour)), Validity: 365 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func (f *fixture) key() []byte {
	k, err := NewKey()
	if err != nil {
		f.t.Fatal(err)
	}
	return k
}

// request builds the CSR the plan asked for, from key.
func (f *fixture) request(name string, key []byte) CSR {
	f.t.Helper()
	req, err := BuildRequest(CreateCSR{DNSNames: f.spec.DNSNames}, key)
	if err != nil {
		f.t.Fatal(err)
	}
	return CSR{Name: name, Created: t0, Hash: f.spec.hash(), Request: req}
}

// sign issues c's certificate from ca, valid for d from at.
func (f *fixture) sign(c CSR, ca *pki.KeyPair, at time.Time, d time.Duration) CSR {
	f.t.Helper()
	r, err := csrsign.ParseRequest(c.Request)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := csrsign.Sign(ca, csrsign.Grant{CSR: r, DNSNames: r.DNSNames, KeyUsage: x509.KeyUsageDigitalSignature, Validity: d}, at, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	c.Approved, c.ApprovedAt, c.Certificate = true, at, out
	return c
}

func TestFirstCertificate(t *testing.T) {
	f := newFixture(t)
	in := Input{Now: t0, Spec: f.spec, Trust: f.ca.CertPEM}
	p := Compute(in)
	if !p.NeedKey || p.Ready || p.Reason != reasonRequested {
		t.Fatalf("no key: %+v", p)
	}
	in.PendingKey = f.key()
	p = Compute(in)
	if p.Create == nil || p.Create.Hash != f.spec.hash() || !slices.Equal(p.Create.DNSNames, f.spec.DNSNames) || !slices.Equal(p.Create.Usages, ServingUsages) {
		t.Fatalf("no CSR: %+v", p)
	}
	csr := f.request("hw-abc", in.PendingKey)
	in.CSRs, in.PendingCSR = []CSR{csr}, csr.Name

	p = Compute(in)
	if p.Reason != ReasonWaitingForApproval || !strings.Contains(p.Message, "hw-abc") || p.Approve != "" || len(p.Delete) > 0 {
		t.Fatalf("unapproved: %+v", p)
	}
	in.Spec.Approve = true
	if p = Compute(in); p.Approve != "hw-abc" {
		t.Fatalf("approve: %+v", p)
	}

	in.CSRs[0].Approved, in.CSRs[0].ApprovedAt = true, t0
	in.Now = t0.Add(time.Minute)
	if p = Compute(in); p.Reason != reasonWaitingForSigner || p.Warning != "" || p.RequeueAfter != time.Minute {
		t.Fatalf("approved: %+v", p)
	}
	in.Now = t0.Add(defaultSignerWait)
	if p = Compute(in); p.Reason != ReasonSignerSilent || p.Warning == "" {
		t.Fatalf("signer silent: %+v", p)
	}

	if p.CABundle != nil {
		t.Fatal("a caBundle before any certificate is served")
	}
	in.CSRs[0] = f.sign(in.CSRs[0], f.ca, in.Now, 24*time.Hour)
	// The configuration exists without the CA: not served yet, but the CA
	// is published first.
	in.PublishedExists, in.Published = true, nil
	p = Compute(in)
	if p.Reason != reasonWaitingForBundle || p.Serve != nil || !pki.BundleContains(p.CABundle, f.ca.Cert) {
		t.Fatalf("before the caBundle: %+v", p)
	}
	in.Published = p.CABundle
	p = Compute(in)
	if p.Serve == nil || !p.Ready || p.Reason != ReasonIssued || p.Serve.CSR != "hw-abc" || p.Serve.Hash != f.spec.hash() {
		t.Fatalf("serve: %+v", p)
	}
	if cs, _ := pki.ParseCertsPEM(p.Serve.CA); len(cs) != 1 || !cs[0].Equal(f.ca.Cert) {
		t.Fatalf("ca.crt %s", p.Serve.CA)
	}
	if len(p.Delete) != 0 || len(p.DrainingCAs) != 0 {
		t.Fatalf("first certificate deletes %v, drains %s", p.Delete, p.DrainingCAs)
	}

	// Steady state: nothing to do until the renewal point (2/3 of 24 h),
	// also while the key's Secret is not removed yet.
	in.Serving, in.PendingCSR = *p.Serve, ""
	p = Compute(in)
	if p.InProgress() || p.NeedKey || p.Create != nil {
		t.Fatalf("left-over key: %+v", p)
	}
	in.PendingKey = nil
	p = Compute(in)
	leaf, _ := pki.ParseCertPEM(in.Serving.Cert)
	if !p.Ready || p.Reason != ReasonIssued || p.NeedKey || p.Create != nil || p.RequeueAfter != pki.RenewalTime(leaf, 0).Sub(in.Now) {
		t.Fatalf("steady: %+v", p)
	}
}

func TestDeniedAndFailed(t *testing.T) {
	f := newFixture(t)
	key := f.key()
	csr := f.request("hw-1", key)
	csr.Denied, csr.Reason, csr.Message = true, "PolicyViolation", "no webhooks here"
	in := Input{Now: t0, Spec: f.spec, Trust: f.ca.CertPEM, PendingKey: key, PendingCSR: "hw-1", CSRs: []CSR{csr}}
	p := Compute(in)
	if p.Reason != ReasonDenied || !strings.Contains(p.Warning, "PolicyViolation") || !strings.Contains(p.Message, "hw-1") || p.Create != nil || len(p.Delete) > 0 {
		t.Fatalf("denied: %+v", p)
	}
	in.CSRs[0].Denied, in.CSRs[0].Failed, in.CSRs[0].Reason = false, true, csrsign.ReasonForbiddenUsage
	if p = Compute(in); p.Reason != reasonFailed || !strings.Contains(p.Message, csrsign.ReasonForbiddenUsage) {
		t.Fatalf("failed: %+v", p)
	}
	// Without a recorded name the CSR is found by its key.
	in.PendingCSR = ""
	if p = Compute(in); p.Reason != reasonFailed {
		t.Fatalf("found by key: %+v", p)
	}
	// Deleting the refused CSR requests again with the same key.
	in.CSRs = nil
	if p = Compute(in); p.Create == nil {
		t.Fatalf("after deletion: %+v", p)
	}
	// A changed spec replaces a refused CSR.
	in.CSRs = []CSR{csr}
	in.Spec.ExpirationSeconds = new(int32)
	*in.Spec.ExpirationSeconds = 3600
	if p = Compute(in); p.Create == nil || !slices.Equal(p.Delete, []string{"hw-1"}) {
		t.Fatalf("spec changed: %+v", p)
	}
}

func TestIssuedButUnusable(t *testing.T) {
	f := newFixture(t)
	key := f.key()
	other := newCA(t, "other")
	csr := f.sign(f.request("hw-1", key), other, t0, time.Hour)
	in := Input{Now: t0, Spec: f.spec, Trust: f.ca.CertPEM, PendingKey: key, PendingCSR: "hw-1", CSRs: []CSR{csr}}
	if p := Compute(in); p.Reason != reasonUntrusted || p.Serve != nil {
		t.Fatalf("untrusted issuer: %+v", p)
	}
	in.Trust = nil
	if p := Compute(in); p.Reason != reasonNoTrust || p.Serve != nil {
		t.Fatalf("no trust: %+v", p)
	}
	// A certificate for another key.
	in.Trust = f.ca.CertPEM
	in.CSRs[0] = f.sign(f.request("hw-1", f.key()), f.ca, t0, time.Hour)
	in.CSRs[0].Request = csr.Request
	if p := Compute(in); p.Reason != reasonBadCertificate || p.Warning == "" || p.Serve != nil {
		t.Fatalf("wrong key: %+v", p)
	}
}

// Renewal and a CA rotation at the signer: the old certificate is served
// until the new one is, the old CSR is kept until then, and the old CA
// stays in the caBundle for the drain grace.
func TestRenewalAcrossCARotation(t *testing.T) {
	f := newFixture(t)
	key1 := f.key()
	old := f.sign(f.request("hw-1", key1), f.ca, t0, 24*time.Hour)
	serving := Serving{Cert: old.Certificate, Key: key1, CA: f.ca.CertPEM, Hash: f.spec.hash(), CSR: "hw-1"}
	in := Input{Now: t0.Add(time.Hour), Spec: f.spec, Trust: f.ca.CertPEM, Serving: serving, CSRs: []CSR{old}, PublishedExists: true, Published: f.ca.CertPEM, DrainGrace: time.Minute}
	if p := Compute(in); p.Reason != ReasonIssued || len(p.Delete) != 0 {
		t.Fatalf("steady: %+v", p)
	}
	// The signer rotates: the new CA joins the trust bundle, the old one
	// leaves it. The served certificate's CA stays published from ca.crt.
	ca2 := newCA(t, "ca-2")
	in.Trust = ca2.CertPEM
	p := Compute(in)
	if !p.Ready || !p.NeedKey || !strings.Contains(p.Message, "IssuerRotated") {
		t.Fatalf("rotated: %+v", p)
	}
	if !pki.BundleContains(p.CABundle, f.ca.Cert) || !pki.BundleContains(p.CABundle, ca2.Cert) {
		t.Fatal("caBundle lost a CA during the rotation")
	}
	key2 := f.key()
	in.PendingKey = key2
	if p = Compute(in); p.Create == nil || len(p.Delete) != 0 {
		t.Fatalf("renewal request: %+v", p)
	}
	renewal := f.sign(f.request("hw-2", key2), ca2, in.Now, 24*time.Hour)
	in.CSRs, in.PendingCSR = []CSR{old, renewal}, "hw-2"
	if p = Compute(in); p.Serve != nil || p.Reason != reasonWaitingForBundle || len(p.Delete) != 0 {
		t.Fatalf("before ca-2 is published: %+v", p)
	}
	in.Published = p.CABundle
	p = Compute(in)
	if p.Serve == nil || p.Serve.CSR != "hw-2" || !slices.Equal(p.Delete, []string{"hw-1"}) {
		t.Fatalf("switch: %+v", p)
	}
	if !pki.BundleContains(p.DrainingCAs, f.ca.Cert) || !p.DrainingUntil.Equal(in.Now.Add(time.Minute)) || !pki.BundleContains(p.CABundle, f.ca.Cert) {
		t.Fatalf("old CA not draining: %+v", p)
	}
	// During the grace the old CA stays; after it, it leaves.
	in.Serving, in.PendingKey, in.PendingCSR, in.CSRs = *p.Serve, nil, "", []CSR{renewal}
	in.DrainingCAs, in.DrainingUntil = p.DrainingCAs, p.DrainingUntil
	in.Now = in.Now.Add(30 * time.Second)
	if p = Compute(in); !pki.BundleContains(p.CABundle, f.ca.Cert) || p.RequeueAfter != 30*time.Second {
		t.Fatalf("draining: %+v", p)
	}
	in.Now = in.DrainingUntil
	if p = Compute(in); pki.BundleContains(p.CABundle, f.ca.Cert) || !pki.BundleContains(p.CABundle, ca2.Cert) || len(p.Delete) != 0 {
		t.Fatalf("drained: %+v", p)
	}
}

func TestRenewalDue(t *testing.T) {
	f := newFixture(t)
	key := f.key()
	c := f.sign(f.request("hw-1", key), f.ca, t0, 3*time.Hour)
	in := Input{Now: t0.Add(2*time.Hour + time.Minute), Spec: f.spec, Trust: f.ca.CertPEM, CSRs: []CSR{c, {Name: "stray", Hash: "x"}},
		Serving: Serving{Cert: c.Certificate, Key: key, CA: f.ca.CertPEM, Hash: f.spec.hash(), CSR: "hw-1"}}
	p := Compute(in)
	if !p.Ready || !p.NeedKey || !strings.Contains(p.Message, pki.ReasonRenewalDue) || !slices.Equal(p.Delete, []string{"stray"}) {
		t.Fatalf("due: %+v", p)
	}
	in.Now = t0.Add(4 * time.Hour)
	if p = Compute(in); p.Ready || !strings.Contains(p.Message, pki.ReasonExpired) {
		t.Fatalf("expired: %+v", p)
	}
	// Renew now.
	in.Now = t0.Add(time.Hour)
	in.RenewRequested = true
	if p = Compute(in); !p.Ready || !p.NeedKey || !strings.Contains(p.Message, pki.ReasonRenewalRequested) {
		t.Fatalf("renew requested: %+v", p)
	}
	in.RenewRequested = false
	// A different signer is a different request.
	in.Now = t0.Add(time.Hour)
	in.Spec.SignerName = "example.com/other"
	if p = Compute(in); !p.Ready || !p.NeedKey || !strings.Contains(p.Message, "RequestChanged") {
		t.Fatalf("signer changed: %+v", p)
	}
}
