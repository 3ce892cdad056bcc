package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const day = 24 * time.Hour

var (
	injNames = ServingDNSNames("hw-injector", "hookwright-system", "")
	ovsNames = ServingDNSNames("hw-oversell", "hookwright-system", "")
)

// caData builds CA Secret data; ca.crt gets the bundle Plan would want when
// every listed CA unexpired at t0 is trusted.
func caData(active, next *KeyPair, retired ...*x509.Certificate) map[string][]byte {
	d := map[string][]byte{}
	var trusted []*x509.Certificate
	if active != nil {
		d[SecretKeyActiveCert], d[SecretKeyActiveKey] = active.CertPEM, active.KeyPEM
		trusted = append(trusted, active.Cert)
	}
	if next != nil {
		d[SecretKeyNextCert], d[secretKeyNextKey] = next.CertPEM, next.KeyPEM
		trusted = append(trusted, next.Cert)
	}
	if len(retired) > 0 {
		d[SecretKeyRetiredCerts] = EncodeCertsPEM(retired)
		trusted = append(trusted, retired...)
	}
	d[SecretKeyBundle] = BuildBundle(trusted, BundleOptions{Max: -1, Now: t0})
	return d
}

func bundle(certs ...*x509.Certificate) []byte { return BuildBundle(certs, BundleOptions{Max: -1}) }

func published(b []byte, names ...string) map[string][]byte {
	m := map[string][]byte{}
	for _, n := range names {
		m[n] = b
	}
	return m
}

func TestCARotationTime(t *testing.T) {
	for _, tc := range []struct {
		name     string
		validity time.Duration
		p        Policy
		wantDays float64 // after NotBefore
	}{
		{"5y default: 2/3 of life", defaultCAValidity, Policy{}, 5 * 365 * 2.0 / 3.0},
		{"1y: lookahead 180d is earlier than 2/3", 365 * day, Policy{}, 185},
		{"1y, lookahead 30d: 2/3 wins", 365 * day, Policy{CALookahead: 30 * day}, 365 * 2.0 / 3.0},
		{"30d CA, lookahead longer than life: floor at half", 30 * day, Policy{}, 15},
		{"fraction 0.9", 100 * day, Policy{CARenewFraction: 0.9, CALookahead: day}, 90},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := mustCA(t, t0, tc.validity)
			got := CARotationTime(ca.Cert, tc.p).Sub(ca.Cert.NotBefore)
			want := time.Duration(tc.wantDays * float64(day))
			if (got - want).Abs() > time.Hour {
				t.Errorf("rotation after %s, want %s", got, want)
			}
		})
	}
}

func TestPlanTransitions(t *testing.T) {
	pol := Policy{CAValidity: 365 * day, ServingValidity: 30 * day, CALookahead: 60 * day}
	a := mustCA(t, t0, 365*day)
	rotA := CARotationTime(a.Cert, pol) // day ~243
	b := mustCA(t, rotA, 365*day)
	foreign := mustCA(t, t0, 365*day)
	expired := mustCA(t, t0.AddDate(-2, 0, 0), 365*day)
	leaf := mustCA(t, t0, 0)
	leaf.Cert, leaf.CertPEM = mustServing(t, a, t0, 0).Cert, mustServing(t, a, t0, 0).CertPEM

	srvA := mustServing(t, a, t0, 30*day, injNames...)
	srvALate := mustServing(t, a, rotA, 30*day, injNames...)
	srvB := mustServing(t, b, rotA.Add(time.Hour), 30*day, injNames...)
	srvForeign := mustServing(t, foreign, t0, 30*day, injNames...)
	serving := func(kp *KeyPair) map[string]Serving {
		return map[string]Serving{"inj": {Cert: kp.CertPEM, Key: kp.KeyPEM, DNSNames: injNames}}
	}
	cfgs := []string{"mwc/injector", "mwc/oversell"}
	mixed := published(bundle(b.Cert, a.Cert), cfgs...)
	mixed["mwc/oversell"] = bundle(a.Cert)
	wiped := published(bundle(b.Cert, a.Cert), cfgs...)
	wiped["mwc/oversell"] = nil
	reordered := published(append(bytes.Clone(a.CertPEM), append([]byte("\n# re-encoded by someone\n"), b.CertPEM...)...), cfgs...)
	corrupt := func(d map[string][]byte, k string, v []byte) map[string][]byte {
		d = maps.Clone(d)
		d[k] = v
		return d
	}
	adopting := caData(a, nil)
	adopting[SecretKeyBundle] = bundle(a.Cert, foreign.Cert)
	staleSecret := caData(a, nil)
	staleSecret[SecretKeyBundle] = bundle(foreign.Cert)

	for _, tc := range []struct {
		name       string
		s          State
		now        time.Time
		want       StepKind
		reason     string
		configs    []string
		targets    []string
		secretOnly bool
	}{
		{"empty", State{}, t0, StepCreateCA, reasonNoCA, nil, nil, false},
		{"active cert garbage", State{CA: corrupt(caData(a, nil), SecretKeyActiveCert, []byte("garbage"))}, t0, StepCreateCA, reasonActiveCAUnusable, nil, nil, false},
		{"active key garbage", State{CA: corrupt(caData(a, nil), SecretKeyActiveKey, []byte("garbage"))}, t0, StepCreateCA, reasonActiveCAUnusable, nil, nil, false},
		{"active key of another CA", State{CA: corrupt(caData(a, nil), SecretKeyActiveKey, foreign.KeyPEM)}, t0, StepCreateCA, reasonActiveCAUnusable, nil, nil, false},
		{"active is a leaf", State{CA: caData(leaf, nil)}, t0, StepCreateCA, reasonActiveCAUnusable, nil, nil, false},
		{"active expired", State{CA: caData(expired, nil)}, t0, StepCreateCA, reasonActiveCAUnusable, nil, nil, false},
		{"active expired, next usable", State{CA: caData(expired, b)}, rotA, StepPromoteNextCA, reasonActiveCAUnusable, nil, nil, false},
		{"steady", State{CA: caData(a, nil), Published: published(bundle(a.Cert), cfgs...), Serving: serving(srvA)}, t0.Add(day), StepNone, reasonUpToDate, nil, nil, false},
		{"no configs, no servers", State{CA: caData(a, nil)}, t0, StepNone, reasonUpToDate, nil, nil, false},
		{"rotation 1ns early", State{CA: caData(a, nil), Published: published(bundle(a.Cert), cfgs...), Serving: serving(srvALate)}, rotA.Add(-time.Nanosecond), StepNone, reasonUpToDate, nil, nil, false},
		{"rotation due", State{CA: caData(a, nil), Published: published(bundle(a.Cert), cfgs...), Serving: serving(srvALate)}, rotA, StepCreateNextCA, reasonCARotationDue, nil, nil, false},
		{"next staged, nothing published", State{CA: caData(a, b), Published: published(bundle(a.Cert), cfgs...), Serving: serving(srvALate)}, rotA, StepPublishBundle, reasonBundleOutdated, cfgs, nil, false},
		{"next staged, one config behind", State{CA: caData(a, b), Published: mixed, Serving: serving(srvALate)}, rotA, StepPublishBundle, reasonBundleOutdated, cfgs[1:], nil, false},
		{"next staged, all carry it, within PromoteDelay", State{CA: caData(a, b), Published: published(bundle(b.Cert, a.Cert), cfgs...), Serving: serving(srvALate)}, rotA.Add(defaultPromoteDelay - time.Nanosecond), StepNone, reasonUpToDate, nil, nil, false},
		{"next staged, all carry it, PromoteDelay passed", State{CA: caData(a, b), Published: published(bundle(b.Cert, a.Cert), cfgs...), Serving: serving(srvALate)}, rotA.Add(defaultPromoteDelay), StepPromoteNextCA, reasonNextCAPublished, nil, nil, false},
		{"waiting to promote, serving renewal still happens", State{CA: caData(a, b), Published: published(bundle(b.Cert, a.Cert), cfgs...), Serving: serving(srvA)}, rotA, StepIssueServing, ReasonExpired, nil, []string{"inj"}, false},
		{"same CAs re-encoded: no write", State{CA: caData(a, b), Published: reordered, Serving: serving(srvALate)}, rotA.Add(time.Minute), StepPromoteNextCA, reasonNextCAPublished, nil, nil, false},
		{"GitOps wiped a caBundle mid-rotation", State{CA: caData(b, nil, a.Cert), Published: wiped, Serving: serving(srvALate)}, rotA, StepPublishBundle, reasonBundleOutdated, cfgs[1:], nil, false},
		{"unparsable caBundle", State{CA: caData(a, nil), Published: published([]byte("garbage"), cfgs...)}, t0, StepPublishBundle, reasonBundleOutdated, cfgs, nil, false},
		{"foreign CA added by someone", State{CA: caData(a, nil), Published: published(bundle(a.Cert, foreign.Cert), cfgs...), Serving: serving(srvA)}, t0, StepPublishBundle, reasonBundleOutdated, cfgs, nil, false},
		{"Secret ca.crt stale", State{CA: staleSecret, Published: published(bundle(a.Cert), cfgs...)}, t0, StepPublishBundle, reasonBundleOutdated, nil, nil, true},
		{"promoted: serving on old CA", State{CA: caData(b, nil, a.Cert), Published: published(bundle(b.Cert, a.Cert), cfgs...), Serving: serving(srvALate)}, rotA.Add(time.Hour), StepIssueServing, ReasonWrongCA, nil, []string{"inj"}, false},
		{"serving from a foreign CA still published: adopt, re-issue", State{CA: adopting, Published: published(bundle(a.Cert, foreign.Cert), cfgs...), Serving: serving(srvForeign)}, t0, StepIssueServing, ReasonWrongCA, nil, []string{"inj"}, false},
		{"retired-certs corrupted mid-rotation: old CA adopted from caBundle", State{CA: corrupt(caData(b, nil, a.Cert), SecretKeyRetiredCerts, []byte("junk")), Published: published(bundle(b.Cert, a.Cert), cfgs...), Serving: serving(srvALate)}, rotA.Add(time.Hour), StepIssueServing, ReasonWrongCA, nil, []string{"inj"}, false},
		{"serving renewal due", State{CA: caData(a, nil), Published: published(bundle(a.Cert), cfgs...), Serving: serving(srvA)}, t0.Add(20 * day), StepIssueServing, ReasonRenewalDue, nil, []string{"inj"}, false},
		{"new server", State{CA: caData(a, nil), Published: published(bundle(a.Cert), cfgs...), Serving: map[string]Serving{"ovs": {DNSNames: ovsNames}}}, t0, StepIssueServing, ReasonMissing, nil, []string{"ovs"}, false},
		{"retired unused", State{CA: caData(b, nil, a.Cert), Published: published(bundle(b.Cert, a.Cert), cfgs...), Serving: serving(srvB)}, rotA.Add(2 * time.Hour), StepDropRetiredCA, reasonRetiredCAUnused, nil, nil, false},
		{"retired still served by a draining pod", State{CA: caData(b, nil, a.Cert), Published: published(bundle(b.Cert, a.Cert), cfgs...), Serving: serving(srvB), Draining: [][]byte{srvALate.CertPEM}}, rotA.Add(2 * time.Hour), StepNone, reasonUpToDate, nil, nil, false},
		{"retired expired", State{CA: caData(b, nil, expired.Cert), Published: published(bundle(b.Cert), cfgs...), Serving: serving(srvB)}, rotA.Add(2 * time.Hour), StepDropRetiredCA, reasonRetiredCAExpired, nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step, err := Plan(tc.s, tc.now, pol)
			if err != nil {
				t.Fatal(err)
			}
			if step.Kind != tc.want || step.Reason != tc.reason {
				t.Fatalf("step %s/%s (%s), want %s/%s", step.Kind, step.Reason, step.Message, tc.want, tc.reason)
			}
			if step.Message == "" {
				t.Error("empty message")
			}
			if !slices.Equal(step.Configs, tc.configs) {
				t.Errorf("configs %v, want %v", step.Configs, tc.configs)
			}
			if !slices.Equal(step.Targets, tc.targets) {
				t.Errorf("targets %v, want %v", step.Targets, tc.targets)
			}
			if tc.want == StepPublishBundle && step.SecretBundleStale != tc.secretOnly {
				t.Errorf("SecretBundleStale %v", step.SecretBundleStale)
			}
			if tc.want == StepNone && step.RequeueAfter <= 0 {
				t.Errorf("RequeueAfter %s", step.RequeueAfter)
			}
			// Plan must not touch its input.
			if tc.s.CA != nil {
				if _, err := Plan(tc.s, tc.now, pol); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestPlanRequeueAfter(t *testing.T) {
	pol := Policy{ServingValidity: 30 * day}
	a := mustCA(t, t0, 0)
	srv := mustServing(t, a, t0, 30*day, injNames...)
	s := State{CA: caData(a, nil), Published: published(bundle(a.Cert), "mwc"), Serving: map[string]Serving{"inj": {Cert: srv.CertPEM, DNSNames: injNames}}}
	now := t0.Add(day)
	step, err := Plan(s, now, pol)
	if err != nil || step.Kind != StepNone {
		t.Fatalf("%v %v", step.Kind, err)
	}
	if want := RenewalTime(srv.Cert, 0).Sub(now); step.RequeueAfter != want {
		t.Errorf("RequeueAfter %s, want %s", step.RequeueAfter, want)
	}
	// Without servers the CA rotation time is next.
	s.Serving = nil
	step, _ = Plan(s, now, pol)
	if want := CARotationTime(a.Cert, pol).Sub(now); step.RequeueAfter != want {
		t.Errorf("RequeueAfter %s, want %s", step.RequeueAfter, want)
	}
	if step.Rotating {
		t.Error("Rotating in steady state")
	}
	// A draining certificate past its renewal point must not cause a hot loop.
	s.Draining = [][]byte{srv.CertPEM}
	step, _ = Plan(s, t0.Add(25*day), pol)
	if step.Kind != StepNone || step.RequeueAfter < time.Hour {
		t.Errorf("draining: %s after %s", step.Kind, step.RequeueAfter)
	}
}

func TestPlanWaitsPromoteDelay(t *testing.T) {
	a := mustCA(t, t0, 0)
	b := mustCA(t, t0.Add(time.Hour), 0)
	s := State{CA: caData(a, b), Published: published(bundle(a.Cert, b.Cert), "mwc")}
	now := t0.Add(time.Hour + 3*time.Second)
	step, err := Plan(s, now, Policy{})
	if err != nil || step.Kind != StepNone || !step.Rotating {
		t.Fatalf("%s rotating=%v %v", step.Kind, step.Rotating, err)
	}
	if step.RequeueAfter != defaultPromoteDelay-3*time.Second {
		t.Errorf("RequeueAfter %s", step.RequeueAfter)
	}
	if step, _ := Plan(s, now, Policy{PromoteDelay: -1}); step.Kind != StepPromoteNextCA {
		t.Errorf("no delay: %s", step.Kind)
	}
	if step, _ := Plan(s, now, Policy{PromoteDelay: time.Minute}); step.RequeueAfter != time.Minute-3*time.Second {
		t.Errorf("1m delay: %s after %s", step.Kind, step.RequeueAfter)
	}
}

func TestPlanBundleTooLarge(t *testing.T) {
	a := mustCA(t, t0, 0)
	b := mustCA(t, t0.Add(time.Hour), 0)
	_, err := Plan(State{CA: caData(a, b)}, t0.Add(2*time.Hour), Policy{MaxBundleCerts: 1})
	if !errors.Is(err, errBundleTooLarge) {
		t.Fatalf("err %v", err)
	}
}

func TestParseCASecretProblems(t *testing.T) {
	a := mustCA(t, t0, 0)
	other := mustCA(t, t0, 0)
	d := caData(a, nil)
	d[SecretKeyNextCert], d[secretKeyNextKey] = other.CertPEM, a.KeyPEM // key of the wrong CA
	d[SecretKeyRetiredCerts] = []byte("junk")
	set := ParseCASecret(d, t0)
	if set.Active == nil || set.Next != nil {
		t.Fatalf("active %v next %v", set.Active != nil, set.Next != nil)
	}
	if len(set.Orphans) != 1 || !set.Orphans[0].Equal(other.Cert) {
		t.Errorf("orphans %v", names(set.Orphans))
	}
	for _, k := range []string{secretKeyNextKey, SecretKeyRetiredCerts} {
		if set.Problems[k] == "" {
			t.Errorf("no problem reported for %s: %v", k, set.Problems)
		}
	}
	// Same CA as active and next: nothing staged.
	if set := ParseCASecret(caData(a, a), t0); set.Next != nil {
		t.Error("active==next treated as staged")
	}
}

func TestApplyErrorsAndPurity(t *testing.T) {
	a := mustCA(t, t0, 0)
	s := State{CA: caData(a, nil), Published: published(nil, "mwc"), Serving: map[string]Serving{"inj": {DNSNames: injNames}}}
	snapshot := deepCopy(s)
	for _, st := range []Step{
		{Kind: StepPromoteNextCA},
		{Kind: "Bogus"},
	} {
		if _, err := Apply(s, st, t0, Policy{}); err == nil {
			t.Errorf("%s: no error", st.Kind)
		}
	}
	if _, err := Apply(State{}, Step{Kind: StepIssueServing, Targets: []string{"x"}}, t0, Policy{}); err == nil {
		t.Error("issue without CA: no error")
	}
	for _, k := range []StepKind{StepCreateCA, StepCreateNextCA, StepIssueServing, StepPublishBundle, StepNone} {
		step, _ := Plan(s, t0, Policy{})
		step.Kind, step.Targets, step.Configs = k, []string{"inj"}, []string{"mwc"}
		if _, err := Apply(s, step, t0, Policy{}); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	if !reflect.DeepEqual(s, snapshot) {
		t.Error("Apply modified its input")
	}
}

func deepCopy(s State) State {
	out := State{CA: map[string][]byte{}, Published: map[string][]byte{}, Serving: map[string]Serving{}}
	for k, v := range s.CA {
		out.CA[k] = bytes.Clone(v)
	}
	for k, v := range s.Published {
		out.Published[k] = bytes.Clone(v)
	}
	for k, v := range s.Serving {
		out.Serving[k] = Serving{Cert: bytes.Clone(v.Cert), Key: bytes.Clone(v.Key), DNSNames: slices.Clone(v.DNSNames)}
	}
	return out
}

// sim drives Plan/Apply like a reconciler would, but applies multi-object
// steps one object at a time and lets pods lag behind re-issued
// certificates, checking after every single write that each certificate in
// use verifies against each published caBundle.
type sim struct {
	t        *testing.T
	s        State
	now      time.Time
	pol      Policy
	steps    map[StepKind]int
	maxTrust int
	writes   int
}

func (m *sim) checkAdmission(when string) {
	m.t.Helper()
	m.writes++
	type inUse struct {
		what string
		cert []byte
	}
	var certs []inUse
	for _, n := range slices.Sorted(maps.Keys(m.s.Serving)) {
		if m.s.Serving[n].Cert != nil {
			certs = append(certs, inUse{n, m.s.Serving[n].Cert})
		}
	}
	for i, d := range m.s.Draining {
		certs = append(certs, inUse{"draining#" + string(rune('0'+i)), d})
	}
	for _, cfg := range slices.Sorted(maps.Keys(m.s.Published)) {
		b := m.s.Published[cfg]
		if certs, err := ParseCertsPEM(b); err == nil && len(certs) > m.maxTrust {
			m.maxTrust = len(certs)
		}
		for _, u := range certs {
			c, err := ParseCertPEM(u.cert)
			if err != nil {
				m.t.Fatalf("%s: %s: %v", when, u.what, err)
			}
			for _, name := range c.DNSNames {
				if err := VerifyServing(c, b, name, m.now); err != nil {
					m.t.Fatalf("%s at %s: admission through %s to %s (%s, issuer %q) would fail: %v",
						when, m.now.Format(time.DateTime), cfg, u.what, name, c.Issuer.CommonName, err)
				}
			}
		}
	}
}

// settle runs Plan until StepNone, returning the steps taken.
func (m *sim) settle() []StepKind {
	m.t.Helper()
	var kinds []StepKind
	for range 20 {
		step, err := Plan(m.s, m.now, m.pol)
		if err != nil {
			m.t.Fatal(err)
		}
		m.steps[step.Kind]++
		if step.Kind == StepNone {
			return kinds
		}
		kinds = append(kinds, step.Kind)
		switch step.Kind {
		case StepPublishBundle:
			if step.SecretBundleStale {
				m.apply(Step{Kind: StepPublishBundle, Bundle: step.Bundle}, "secret ca.crt")
			}
			for _, c := range step.Configs {
				one := step
				one.Configs = []string{c}
				m.apply(one, "publish "+c)
			}
		case StepIssueServing:
			for _, target := range step.Targets {
				if old := m.s.Serving[target].Cert; old != nil {
					m.s.Draining = append(m.s.Draining, old) // pods still serve it
				}
				one := step
				one.Targets = []string{target}
				m.apply(one, "issue "+target)
			}
		default:
			m.apply(step, string(step.Kind))
		}
	}
	m.t.Fatalf("no steady state after 20 steps at %s: %v", m.now, kinds)
	return nil
}

func (m *sim) apply(step Step, what string) {
	m.t.Helper()
	next, err := Apply(m.s, step, m.now, m.pol)
	if err != nil {
		m.t.Fatalf("%s: %v", what, err)
	}
	m.s = next
	m.checkAdmission(what)
}

func TestFullRotationZeroFailedAdmissions(t *testing.T) {
	pol := Policy{CAValidity: 300 * day, ServingValidity: 30 * day, CALookahead: 60 * day}
	m := &sim{t: t, now: t0, pol: pol, steps: map[StepKind]int{}, s: State{
		Published: map[string][]byte{"mwc/injector": nil, "mwc/oversell": nil},
		Serving:   map[string]Serving{"injector": {DNSNames: injNames}, "oversell": {DNSNames: ovsNames}},
	}}
	boot := m.settle()
	if want := []StepKind{StepCreateCA, StepPublishBundle, StepIssueServing}; !slices.Equal(boot, want) {
		t.Fatalf("bootstrap %v, want %v", boot, want)
	}

	var rotations [][]StepKind
	end := t0.AddDate(3, 0, 0)
	for tick := 0; m.now.Before(end); tick++ {
		// Pods reload between ticks; jitter the tick so boundaries vary.
		m.s.Draining = nil
		m.checkAdmission("pods reloaded")
		m.now = m.now.Add(day + time.Duration(tick%13)*2*time.Hour)
		kinds := m.settle()
		if slices.ContainsFunc(kinds, func(k StepKind) bool {
			return k == StepCreateNextCA || k == StepPromoteNextCA || k == StepDropRetiredCA
		}) {
			rotations = append(rotations, kinds)
		}
	}
	if got := m.steps[StepPromoteNextCA]; got < 3 {
		t.Errorf("%d CA promotions in 3 years of 300-day CAs, want >= 3", got)
	}
	if got, want := m.steps[StepDropRetiredCA], m.steps[StepPromoteNextCA]; got != want {
		t.Errorf("%d retired CAs dropped for %d promotions", got, want)
	}
	if m.maxTrust != 2 {
		t.Errorf("largest published caBundle had %d CAs, want 2", m.maxTrust)
	}
	// Each rotation goes create-next → publish; after PromoteDelay (next
	// tick) promote → re-issue; the old CA goes only after pods reloaded.
	want := [][]StepKind{
		{StepCreateNextCA, StepPublishBundle},
		{StepPromoteNextCA, StepIssueServing},
		{StepDropRetiredCA, StepPublishBundle},
	}
	for i, r := range rotations {
		if w := want[i%3]; !slices.Equal(r[:min(len(r), len(w))], w) {
			t.Errorf("rotation phase %d: steps %v, want prefix %v", i, r, w)
		}
	}
	final, _ := Plan(m.s, m.now, pol)
	if final.Rotating {
		t.Error("still rotating at the end")
	}
	t.Logf("%d writes checked; steps %v", m.writes, m.steps)
}

// The operator's CA Secret is deleted (or replaced) while webhooks serve
// certificates from the lost CA. The old CA is adopted from the published
// caBundle until nothing uses it, so no admission fails.
func TestCASecretLostAdoptsPublishedCA(t *testing.T) {
	pol := Policy{CAValidity: 365 * day, ServingValidity: 30 * day}
	lost := mustCA(t, t0, 365*day)
	srv := mustServing(t, lost, t0, 30*day, injNames...)
	m := &sim{t: t, now: t0.Add(day), pol: pol, steps: map[StepKind]int{}, s: State{
		Published: published(bundle(lost.Cert), "mwc/a", "mwc/b"),
		Serving:   map[string]Serving{"injector": {Cert: srv.CertPEM, Key: srv.KeyPEM, DNSNames: injNames}},
	}}
	m.checkAdmission("start")
	got := m.settle()
	want := []StepKind{StepCreateCA, StepPublishBundle, StepIssueServing}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	if !BundleContains(m.s.Published["mwc/a"], lost.Cert) {
		t.Fatal("lost CA dropped while a pod still serves its certificate")
	}
	m.s.Draining = nil
	got = m.settle()
	if !slices.Equal(got, []StepKind{StepPublishBundle}) || BundleContains(m.s.Published["mwc/a"], lost.Cert) {
		t.Fatalf("after reload: steps %v, lost CA still published: %v", got, BundleContains(m.s.Published["mwc/a"], lost.Cert))
	}
}

// A corrupted active key is replaced; the old certificate is retired, not
// forgotten, so its serving certificates keep verifying until re-issued.
func TestCorruptActiveKeyRetiresOldCert(t *testing.T) {
	pol := Policy{CAValidity: 365 * day, ServingValidity: 30 * day}
	a := mustCA(t, t0, 365*day)
	srv := mustServing(t, a, t0, 30*day, injNames...)
	d := caData(a, nil)
	d[SecretKeyActiveKey] = []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	m := &sim{t: t, now: t0.Add(day), pol: pol, steps: map[StepKind]int{}, s: State{
		CA:        d,
		Published: published(bundle(a.Cert), "mwc/a"),
		Serving:   map[string]Serving{"injector": {Cert: srv.CertPEM, Key: srv.KeyPEM, DNSNames: injNames}},
	}}
	got := m.settle()
	if want := []StepKind{StepCreateCA, StepPublishBundle, StepIssueServing}; !slices.Equal(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	if !strings.Contains(string(m.s.CA[SecretKeyRetiredCerts]), "CERTIFICATE") {
		t.Error("old CA not retired")
	}
	m.s.Draining = nil
	got = m.settle()
	if want := []StepKind{StepDropRetiredCA, StepPublishBundle}; !slices.Equal(got, want) {
		t.Fatalf("cleanup steps %v, want %v", got, want)
	}
}

// The operator was down past the CA's expiry: admissions fail anyway, so the
// CA is replaced outright rather than rotated.
func TestExpiredCAReplacedOutright(t *testing.T) {
	pol := Policy{CAValidity: 30 * day, ServingValidity: 10 * day}
	a := mustCA(t, t0, 30*day)
	s := State{CA: caData(a, nil), Published: published(bundle(a.Cert), "mwc")}
	step, err := Plan(s, a.Cert.NotAfter, pol)
	if err != nil || step.Kind != StepCreateCA {
		t.Fatalf("%s %v", step.Kind, err)
	}
	s, err = Apply(s, step, a.Cert.NotAfter, pol)
	if err != nil {
		t.Fatal(err)
	}
	// The expired CA leaves the caBundle first, then the Secret.
	for _, want := range []StepKind{StepPublishBundle, StepDropRetiredCA, StepNone} {
		step, _ = Plan(s, a.Cert.NotAfter, pol)
		if step.Kind != want {
			t.Fatalf("%s/%s, want %s", step.Kind, step.Reason, want)
		}
		if want == StepDropRetiredCA && step.Reason != reasonRetiredCAExpired {
			t.Errorf("reason %s", step.Reason)
		}
		if s, err = Apply(s, step, a.Cert.NotAfter, pol); err != nil {
			t.Fatal(err)
		}
	}
	if BundleContains(s.Published["mwc"], a.Cert) || len(s.CA[SecretKeyRetiredCerts]) > 0 {
		t.Error("expired CA still around")
	}
}

// Arbitrary bytes anywhere in the inputs must never panic Plan or Apply,
// and Plan must never pick a step Apply cannot carry out.
func FuzzPlanApply(f *testing.F) {
	a := mustCA(f, t0, 0)
	srv := mustServing(f, a, t0, 0, injNames...)
	f.Add(a.CertPEM, a.KeyPEM, []byte(nil), srv.CertPEM, bundle(a.Cert))
	f.Add([]byte("garbage"), a.KeyPEM, a.CertPEM, srv.KeyPEM, []byte("x"))
	f.Add(a.CertPEM[:50], []byte{}, srv.CertPEM, []byte(nil), srv.CertPEM)
	f.Fuzz(func(t *testing.T, active, key, retired, servingCert, pub []byte) {
		s := State{
			CA:        map[string][]byte{SecretKeyActiveCert: active, SecretKeyActiveKey: key, SecretKeyRetiredCerts: retired},
			Published: map[string][]byte{"mwc": pub},
			Serving:   map[string]Serving{"inj": {Cert: servingCert, DNSNames: injNames}},
		}
		for range 6 {
			step, err := Plan(s, t0.Add(time.Hour), Policy{})
			if err != nil || step.Kind == StepNone {
				return
			}
			if s, err = Apply(s, step, t0.Add(time.Hour), Policy{}); err != nil {
				t.Fatalf("Apply(%s): %v", step.Kind, err)
			}
		}
	})
}

func FuzzParseCertsPEM(f *testing.F) {
	a := mustCA(f, t0, 0)
	f.Add(a.CertPEM)
	f.Add(append(bytes.Clone(a.CertPEM), a.KeyPEM...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCertsPEM(data)
		if (err == nil) != (len(certs) > 0) {
			t.Fatalf("%d certs with err %v", len(certs), err)
		}
		_, _ = ParseKeyPEM(data)
		_ = BuildBundle(certs, BundleOptions{Now: t0})
	})
}

// BenchmarkPlanManyConfigs: one Plan of a shared CA published to 50
// webhook configurations, with 50 serving certificates and a retired CA
// that signs none of them (the operator's reconcile of one CR of 50).
func BenchmarkPlanManyConfigs(b *testing.B) {
	pol := Policy{CAValidity: 365 * day, ServingValidity: 30 * day, CALookahead: 60 * day}
	a := mustCA(b, t0, 365*day)
	old := mustCA(b, t0.AddDate(0, -6, 0), 365*day)
	s := State{CA: caData(a, nil, old.Cert), Serving: map[string]Serving{}}
	s.Published = map[string][]byte{}
	for i := range 50 {
		name := fmt.Sprintf("cr-%02d", i)
		srv := mustServing(b, a, t0, 30*day, ServingDNSNames(name, "hookwright-system", "")...)
		s.Serving[name] = Serving{Cert: srv.CertPEM, Key: srv.KeyPEM, DNSNames: ServingDNSNames(name, "hookwright-system", "")}
		s.Published["mwc/"+name] = bundle(a.Cert, old.Cert)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(s, t0.Add(day), pol); err != nil {
			b.Fatal(err)
		}
	}
}
