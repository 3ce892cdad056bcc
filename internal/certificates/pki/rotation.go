package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// CA Secret data keys. Only SecretKeyBundle has a certificate file extension,
// so the CA-directory watcher (internal/certificates/cadir) on the mounted
// Secret (default patterns *.crt, *.pem) sees the trust bundle and nothing
// else.
const (
	SecretKeyBundle       = "ca.crt"        // trust bundle to publish: PEM, newest first
	SecretKeyActiveCert   = "active-cert"   // signing CA certificate (PEM)
	SecretKeyActiveKey    = "active-key"    // signing CA key (PKCS#8 PEM)
	SecretKeyNextCert     = "next-cert"     // staged CA, published but not yet signing
	secretKeyNextKey      = "next-key"      // staged CA key
	SecretKeyRetiredCerts = "retired-certs" // former signing CAs still trusted (PEM bundle, no keys)
)

// StepKind names one step of the CA/serving lifecycle.
type StepKind string

// Steps, in the priority order Plan evaluates them.
const (
	// StepCreateCA: there is no usable signing CA. Generate one; any old
	// active certificate that still parses is retired, not forgotten.
	StepCreateCA StepKind = "CreateCA"
	// StepCreateNextCA: the active CA reached its rotation time. Generate the
	// next CA and stage it; it is published but does not sign yet.
	StepCreateNextCA StepKind = "CreateNextCA"
	// StepPublishBundle: Bundle must be written to Configs (and, when
	// SecretBundleStale, to the CA Secret's ca.crt).
	StepPublishBundle StepKind = "PublishBundle"
	// StepPromoteNextCA: every owned configuration carries the next CA; it
	// becomes the signing CA and the old one is retired.
	StepPromoteNextCA StepKind = "PromoteNextCA"
	// StepIssueServing: Targets need a serving certificate from the active CA.
	StepIssueServing StepKind = "IssueServing"
	// StepDropRetiredCA: no serving certificate in use chains to Drop (or they
	// expired); remove them from the trust bundle.
	StepDropRetiredCA StepKind = "DropRetiredCA"
	// StepNone: nothing to do until RequeueAfter.
	StepNone StepKind = "None"
)

// Step-level reasons (serving targets use the Reason* constants of
// ServingRenewalReason).
const (
	reasonNoCA             = "NoCA"
	reasonActiveCAUnusable = "ActiveCAUnusable"
	reasonCARotationDue    = "CARotationDue"
	reasonCARotationAsked  = "CARotationRequested"
	reasonBundleOutdated   = "BundleOutdated"
	reasonNextCAPublished  = "NextCAPublished"
	reasonRetiredCAUnused  = "RetiredCAUnused"
	reasonRetiredCAExpired = "RetiredCAExpired"
	reasonUpToDate         = "UpToDate"
)

// errBundleTooLarge means the CAs that must stay trusted exceed
// Policy.MaxBundleCerts; Plan refuses rather than drop one still in use.
var errBundleTooLarge = errors.New("CAs that must stay trusted exceed the caBundle cap")

// Policy tunes Plan and Apply. Zero values take the package defaults.
type Policy struct {
	CAValidity           time.Duration // lifetime of generated CAs; default defaultCAValidity
	ServingValidity      time.Duration // lifetime of serving certs; default DefaultServingValidity
	CARenewFraction      float64       // rotate the CA after this fraction of its life; default 2/3
	CALookahead          time.Duration // ...or this long before NotAfter, if earlier; default defaultCALookahead
	ServingRenewFraction float64       // renew serving certs after this fraction; default 2/3
	MaxBundleCerts       int           // default defaultMaxBundleCerts
	CACommonName         string        // default defaultCACommonName + "@<unix>"
	// PromoteDelay is the minimum age of a staged CA before it may sign:
	// time for every API server's webhook informer to pick up the caBundle
	// that was just written. Default defaultPromoteDelay; negative means none.
	PromoteDelay time.Duration
}

// defaultPromoteDelay is how long a staged CA waits before it signs: API
// servers see webhook configuration changes through an informer, normally
// within a second; 10 s leaves margin at little cost.
const defaultPromoteDelay = 10 * time.Second

func (p Policy) withDefaults() Policy {
	if p.CAValidity <= 0 {
		p.CAValidity = defaultCAValidity
	}
	if p.ServingValidity <= 0 {
		p.ServingValidity = DefaultServingValidity
	}
	if p.CARenewFraction <= 0 || p.CARenewFraction > 1 {
		p.CARenewFraction = defaultRenewFraction
	}
	if p.CALookahead <= 0 {
		p.CALookahead = defaultCALookahead
	}
	if p.ServingRenewFraction <= 0 || p.ServingRenewFraction > 1 {
		p.ServingRenewFraction = defaultRenewFraction
	}
	if p.MaxBundleCerts <= 0 {
		p.MaxBundleCerts = defaultMaxBundleCerts
	}
	switch {
	case p.PromoteDelay == 0:
		p.PromoteDelay = defaultPromoteDelay
	case p.PromoteDelay < 0:
		p.PromoteDelay = 0
	}
	return p
}

// CARotationTime is when Plan starts rotating ca: the earlier of
// NotBefore+fraction*lifetime and NotAfter-lookahead, but never before half
// the lifetime (so a lookahead longer than a short CA's life cannot make
// every new CA rotate at once).
func CARotationTime(ca *x509.Certificate, p Policy) time.Time {
	p = p.withDefaults()
	life := ca.NotAfter.Sub(ca.NotBefore)
	at := ca.NotBefore.Add(time.Duration(float64(life) * p.CARenewFraction))
	if look := ca.NotAfter.Add(-p.CALookahead); look.Before(at) {
		at = look
	}
	if floor := ca.NotBefore.Add(life / 2); at.Before(floor) {
		at = floor
	}
	return at
}

// Serving is one serving certificate in use.
type Serving struct {
	Cert []byte // PEM; what the webhook pods serve (or will, once reloaded)
	Key  []byte // PEM; nil when only the certificate is known
	// DNSNames wanted for this server, e.g. ServingDNSNames(svc, ns, "").
	DNSNames []string
	// RenewRequested: an administrator asked for a new certificate now
	// (the renew-now annotation on the CR, not yet handled).
	RenewRequested bool
}

// State is everything Plan looks at. Maps are keyed by caller-chosen names
// (e.g. "MutatingWebhookConfiguration/foo", "ns/secret"); Plan treats them as
// opaque and reports them sorted.
type State struct {
	// CA is the CA Secret's data (SecretKey* keys); nil or empty means none yet.
	CA map[string][]byte
	// Published is the caBundle of every owned webhook configuration, as read
	// back from the API server (not as intended), so that "carries the new
	// CA" is an observation. A missing or wiped caBundle is an empty value.
	Published map[string][]byte
	// Serving lists the serving certificates the operator manages (one per
	// webhook server, e.g. its Secret); they are the renewal targets.
	Serving map[string]Serving
	// Draining holds certificates (PEM) still served by pods that have not
	// reloaded a re-issued Serving certificate yet. They keep their CA
	// trusted but are never renewal targets. Retired CAs are dropped once
	// nothing in Serving or Draining chains to them, so list an old
	// certificate here until every pod has reloaded (e.g. from a served
	// certificate fingerprint the pods report, or a grace period).
	Draining [][]byte
	// RotateRequested: an administrator asked for a CA rotation now (the
	// rotate-now annotation on the CA Secret, not yet handled). Plan then
	// stages a next CA at once, with the usual overlap, unless one is
	// already staged.
	RotateRequested bool
}

// Step is Plan's answer: one action, why, and what it touches.
type Step struct {
	Kind    StepKind
	Reason  string // CamelCase, fit for an Event/condition reason
	Message string // human-readable detail

	// Bundle is the caBundle every configuration should carry (PEM, newest
	// first). Set on every step when a signing CA exists.
	Bundle []byte
	// Configs whose published caBundle differs from Bundle (PublishBundle), sorted.
	Configs []string
	// SecretBundleStale: the CA Secret's ca.crt differs from Bundle (PublishBundle).
	SecretBundleStale bool
	// Targets needing a serving certificate (IssueServing), sorted, with the
	// reason for each in TargetReasons.
	Targets       []string
	TargetReasons map[string]string
	// Drop lists retired CAs to remove (DropRetiredCA).
	Drop []*x509.Certificate
	// RequeueAfter is how long until a time-based step becomes due (StepNone).
	RequeueAfter time.Duration
	// Rotating is true while a next or retired CA exists: a rotation is in
	// progress (e.g. hold operator upgrades).
	Rotating bool
}

// CASet is the parsed CA Secret.
type CASet struct {
	Active  *KeyPair            // nil if missing or unusable
	Next    *KeyPair            // nil if missing or unusable
	Retired []*x509.Certificate // parsed retired CAs, expired ones included
	// Orphans are CA certificates from active-cert/next-cert whose key is
	// missing or broken; kept trusted while serving certs still chain to them.
	Orphans []*x509.Certificate
	// Problems maps a Secret key to what is wrong with it.
	Problems map[string]string
}

// ParseCASecret parses CA Secret data. A CA is usable when its certificate
// and key parse, match, the certificate is a CA, and now is before NotAfter.
// Unusable entries are reported in Problems, never returned as errors, so
// Plan can decide what to do about them.
func ParseCASecret(data map[string][]byte, now time.Time) CASet {
	var set CASet
	problem := func(k, msg string) {
		if set.Problems == nil {
			set.Problems = map[string]string{}
		}
		set.Problems[k] = msg
	}
	load := func(certKey, keyKey string) *KeyPair {
		certPEM, keyPEM := data[certKey], data[keyKey]
		if len(certPEM) == 0 && len(keyPEM) == 0 {
			return nil
		}
		cert, err := ParseCertPEM(certPEM)
		if err != nil {
			problem(certKey, err.Error())
			return nil
		}
		switch {
		case !cert.IsCA:
			problem(certKey, errNotCA.Error())
			return nil
		case !now.Before(cert.NotAfter):
			problem(certKey, "expired at "+fmtTime(cert.NotAfter))
			return nil
		}
		kp, err := ParseKeyPair(certPEM, keyPEM)
		if err != nil {
			problem(keyKey, err.Error())
			set.Orphans = append(set.Orphans, cert)
			return nil
		}
		return kp
	}
	set.Active = load(SecretKeyActiveCert, SecretKeyActiveKey)
	set.Next = load(SecretKeyNextCert, secretKeyNextKey)
	if set.Active != nil && set.Next != nil && set.Active.Cert.Equal(set.Next.Cert) {
		set.Next = nil // same CA twice: nothing is staged
	}
	if b := data[SecretKeyRetiredCerts]; len(b) > 0 {
		certs, err := ParseCertsPEM(b)
		if err != nil {
			problem(SecretKeyRetiredCerts, err.Error())
		}
		set.Retired = certs
	}
	return set
}

// TrustAnchors is what a CA Secret asks others to trust at now: the
// active, next (staged) and retired CAs and CAs whose key broke, unexpired,
// deduplicated, newest first (PEM without headers, as a ClusterTrustBundle
// accepts it); nil when there is none.
func TrustAnchors(caData map[string][]byte, now time.Time) []byte {
	set := ParseCASecret(caData, now)
	var all []*x509.Certificate
	for _, kp := range []*KeyPair{set.Next, set.Active} {
		if kp != nil {
			all = append(all, kp.Cert)
		}
	}
	all = append(append(all, set.Retired...), set.Orphans...)
	return BuildBundle(all, BundleOptions{Now: now, Max: -1, CAOnly: true})
}

// Plan computes the next step from s at now. It only reads s. The order of
// checks is what makes rotation safe:
//
//  1. no usable signing CA → CreateCA (or promote a usable next CA);
//  2. active CA at its rotation time and nothing staged → CreateNextCA;
//  3. any configuration (or the Secret's ca.crt) differs from the bundle →
//     PublishBundle; nothing below runs until every configuration carries
//     every CA that signs, will sign, or signed a certificate in use;
//  4. a staged CA exists and is PromoteDelay old → PromoteNextCA (it is
//     now in every configuration); until then the steps below still run;
//  5. serving certificates not fine per ServingRenewalReason against the
//     active CA → IssueServing (the active CA is published everywhere by 3);
//  6. retired CAs that nothing in use chains to, or expired → DropRetiredCA,
//     after which 3 publishes the smaller bundle;
//  7. otherwise None, with RequeueAfter set to the next due time.
//
// The error is non-nil only for errBundleTooLarge.
func Plan(s State, now time.Time, p Policy) (Step, error) {
	p = p.withDefaults()
	ca := ParseCASecret(s.CA, now)
	step := Step{Rotating: ca.Next != nil || len(ca.Retired) > 0}

	if ca.Active == nil {
		if ca.Next != nil {
			step.Kind, step.Reason = StepPromoteNextCA, reasonActiveCAUnusable
			step.Message = "active CA unusable (" + problems(ca) + "); promoting the staged CA"
			return step, nil
		}
		step.Kind, step.Reason = StepCreateCA, reasonNoCA
		step.Message = "no CA yet"
		if len(ca.Problems) > 0 || len(s.CA[SecretKeyActiveCert]) > 0 {
			step.Reason = reasonActiveCAUnusable
			step.Message = "active CA unusable: " + problems(ca)
		}
		return step, nil
	}

	if ca.Next == nil && s.RotateRequested {
		step.Kind, step.Reason = StepCreateNextCA, reasonCARotationAsked
		step.Message = fmt.Sprintf("rotation of CA %q requested; staging the next CA", ca.Active.Cert.Subject.CommonName)
		return step, nil
	}
	if rotateAt := CARotationTime(ca.Active.Cert, p); ca.Next == nil && !now.Before(rotateAt) {
		step.Kind, step.Reason = StepCreateNextCA, reasonCARotationDue
		step.Message = fmt.Sprintf("CA %q rotation due at %s, expires %s", ca.Active.Cert.Subject.CommonName, fmtTime(rotateAt), fmtTime(ca.Active.Cert.NotAfter))
		return step, nil
	}

	inUse := inUseCerts(s)
	bundleCerts, err := desiredCAs(ca, s, inUse, now, p)
	if err != nil {
		return step, err
	}
	step.Bundle = EncodeCertsPEM(bundleCerts)
	want := fingerprints(bundleCerts)
	for _, name := range slices.Sorted(maps.Keys(s.Published)) {
		if !sameFingerprints(s.Published[name], want) {
			step.Configs = append(step.Configs, name)
		}
	}
	step.SecretBundleStale = !sameFingerprints(s.CA[SecretKeyBundle], want)
	if len(step.Configs) > 0 || step.SecretBundleStale {
		step.Kind, step.Reason = StepPublishBundle, reasonBundleOutdated
		step.Message = fmt.Sprintf("caBundle (%d CAs) to publish to %d configurations", len(bundleCerts), len(step.Configs))
		if step.SecretBundleStale {
			step.Message += " and the CA Secret"
		}
		return step, nil
	}

	// A staged CA is in every configuration now. Its creation time is
	// NotBefore+Backdate (NewCA backdates), which bounds when it was first
	// published, so the delay needs no extra bookkeeping in the Secret.
	var promoteAt time.Time
	if ca.Next != nil {
		promoteAt = ca.Next.Cert.NotBefore.Add(Backdate + p.PromoteDelay)
		if !now.Before(promoteAt) {
			step.Kind, step.Reason = StepPromoteNextCA, reasonNextCAPublished
			step.Message = fmt.Sprintf("CA %q is in all %d configurations; it becomes the signing CA", ca.Next.Cert.Subject.CommonName, len(s.Published))
			return step, nil
		}
	}

	for _, name := range slices.Sorted(maps.Keys(s.Serving)) {
		sv := s.Serving[name]
		reason, msg := ServingRenewalReason(ServingCheck{
			CertPEM: sv.Cert, KeyPEM: sv.Key, DNSNames: sv.DNSNames,
			Signer: ca.Active.Cert, RenewFraction: p.ServingRenewFraction, RenewRequested: sv.RenewRequested,
		}, now)
		if reason == "" {
			continue
		}
		if step.TargetReasons == nil {
			step.TargetReasons = map[string]string{}
		}
		step.Targets = append(step.Targets, name)
		step.TargetReasons[name] = reason
		step.Message += fmt.Sprintf("%s: %s (%s); ", name, reason, msg)
	}
	if len(step.Targets) > 0 {
		step.Kind, step.Reason = StepIssueServing, step.TargetReasons[step.Targets[0]]
		step.Message = strings.TrimSuffix(step.Message, "; ")
		return step, nil
	}

	var msgs []string
	step.Reason = reasonRetiredCAUnused
	for _, r := range ca.Retired {
		switch {
		case !now.Before(r.NotAfter):
			step.Drop = append(step.Drop, r)
			step.Reason = reasonRetiredCAExpired
			msgs = append(msgs, fmt.Sprintf("%q expired", r.Subject.CommonName))
		case !slices.ContainsFunc(inUse, func(c *x509.Certificate) bool { return SignedBy(c, r) }):
			step.Drop = append(step.Drop, r)
			msgs = append(msgs, fmt.Sprintf("%q signs no serving certificate in use", r.Subject.CommonName))
		}
	}
	if len(step.Drop) > 0 {
		step.Kind = StepDropRetiredCA
		step.Message = strings.Join(msgs, "; ")
		return step, nil
	}

	step.Kind, step.Reason = StepNone, reasonUpToDate
	next := CARotationTime(ca.Active.Cert, p)
	if ca.Next != nil {
		next = promoteAt
	}
	for _, c := range inUseCerts(State{Serving: s.Serving}) { // draining certs are not renewed
		if at := RenewalTime(c, p.ServingRenewFraction); at.Before(next) {
			next = at
		}
	}
	for _, r := range ca.Retired {
		if r.NotAfter.Before(next) {
			next = r.NotAfter
		}
	}
	step.RequeueAfter = max(next.Sub(now), time.Second)
	step.Message = "up to date; next check in " + step.RequeueAfter.Round(time.Second).String()
	if ca.Next != nil {
		step.Message = fmt.Sprintf("CA %q published; promoting at %s", ca.Next.Cert.Subject.CommonName, fmtTime(promoteAt))
	}
	return step, nil
}

// desiredCAs is the trust bundle: next, active and unexpired retired CAs,
// plus any other known CA (published, in the Secret's ca.crt, or orphaned)
// that a serving certificate in use chains to. Dropping one of those would
// fail admissions, so they are adopted until nothing uses them.
func desiredCAs(ca CASet, s State, inUse []*x509.Certificate, now time.Time, p Policy) ([]*x509.Certificate, error) {
	must := []*x509.Certificate{ca.Active.Cert}
	if ca.Next != nil {
		must = append(must, ca.Next.Cert)
	}
	must = append(must, ca.Retired...)
	// Every configuration of a CA publishes the same bundle: each distinct
	// bundle is parsed once and each distinct CA checked once, so a Plan
	// costs O(configurations + CAs × certificates in use), not their
	// product (50 CRs: 7,500 signature checks a Plan before).
	known := slices.Clone(ca.Orphans)
	parsed := map[string]bool{}
	for _, b := range append(slices.Collect(maps.Values(s.Published)), s.CA[SecretKeyBundle]) {
		if parsed[string(b)] {
			continue
		}
		parsed[string(b)] = true
		if certs, err := ParseCertsPEM(b); err == nil {
			known = append(known, certs...)
		}
	}
	checked := map[[sha256.Size]byte]bool{}
	for _, k := range known {
		if fp := Fingerprint(k); !k.IsCA || checked[fp] {
			continue
		} else {
			checked[fp] = true
		}
		if slices.ContainsFunc(inUse, func(c *x509.Certificate) bool { return SignedBy(c, k) }) {
			must = append(must, k)
		}
	}
	out := tidyBundle(must, BundleOptions{Now: now, Max: -1})
	if len(out) > p.MaxBundleCerts {
		return nil, fmt.Errorf("%w: %d > %d", errBundleTooLarge, len(out), p.MaxBundleCerts)
	}
	return out, nil
}

// Apply returns the state after step has fully taken effect: CA Secret data
// updated and its ca.crt refreshed, Configs carrying Bundle, Targets holding
// newly issued certificates. The reconciler writes the differences to the
// API; s is not modified. Generated certificates start at now.
func Apply(s State, step Step, now time.Time, p Policy) (State, error) {
	p = p.withDefaults()
	out := State{
		CA:        maps.Clone(s.CA),
		Published: maps.Clone(s.Published),
		Serving:   maps.Clone(s.Serving),
		Draining:  slices.Clone(s.Draining),
	}
	if out.CA == nil {
		out.CA = map[string][]byte{}
	}
	clk := FixedClock(now)
	ca := ParseCASecret(out.CA, now)
	newCA := func() (*KeyPair, error) {
		return NewCA(CAOptions{CommonName: p.CACommonName, Validity: p.CAValidity, Clock: clk})
	}
	retire := func(certKey string) {
		if c, err := ParseCertPEM(out.CA[certKey]); err == nil && c.IsCA {
			setRetired(out.CA, append(ca.Retired, c))
		}
	}

	switch step.Kind {
	case StepCreateCA:
		kp, err := newCA()
		if err != nil {
			return s, err
		}
		retire(SecretKeyActiveCert)
		out.CA[SecretKeyActiveCert], out.CA[SecretKeyActiveKey] = kp.CertPEM, kp.KeyPEM
		delete(out.CA, SecretKeyNextCert)
		delete(out.CA, secretKeyNextKey)
	case StepCreateNextCA:
		kp, err := newCA()
		if err != nil {
			return s, err
		}
		out.CA[SecretKeyNextCert], out.CA[secretKeyNextKey] = kp.CertPEM, kp.KeyPEM
	case StepPromoteNextCA:
		if ca.Next == nil {
			return s, errors.New("promote: no usable next CA")
		}
		retire(SecretKeyActiveCert)
		out.CA[SecretKeyActiveCert], out.CA[SecretKeyActiveKey] = ca.Next.CertPEM, ca.Next.KeyPEM
		delete(out.CA, SecretKeyNextCert)
		delete(out.CA, secretKeyNextKey)
	case StepPublishBundle:
		if out.Published == nil && len(step.Configs) > 0 {
			out.Published = map[string][]byte{}
		}
		for _, c := range step.Configs {
			out.Published[c] = bytesClone(step.Bundle)
		}
	case StepIssueServing:
		if ca.Active == nil {
			return s, errors.New("issue: no usable active CA")
		}
		for _, name := range step.Targets {
			sv := out.Serving[name]
			kp, err := NewServingCert(ca.Active, ServingOptions{DNSNames: sv.DNSNames, Validity: p.ServingValidity, Clock: clk})
			if err != nil {
				return s, fmt.Errorf("issue %s: %w", name, err)
			}
			out.Serving[name] = Serving{Cert: kp.CertPEM, Key: kp.KeyPEM, DNSNames: slices.Clone(sv.DNSNames)}
		}
	case StepDropRetiredCA:
		setRetired(out.CA, slices.DeleteFunc(slices.Clone(ca.Retired), func(c *x509.Certificate) bool {
			return slices.ContainsFunc(step.Drop, c.Equal)
		}))
	case StepNone:
	default:
		return s, fmt.Errorf("unknown step %q", step.Kind)
	}

	// Keep the Secret's trust bundle in line with the new CA state so a
	// --ca-dir watcher on the mounted Secret sees the same bundle Plan wants.
	if after := ParseCASecret(out.CA, now); after.Active != nil {
		certs, err := desiredCAs(after, out, inUseCerts(out), now, p)
		if err != nil {
			return s, err
		}
		out.CA[SecretKeyBundle] = EncodeCertsPEM(certs)
	}
	return out, nil
}

func setRetired(data map[string][]byte, certs []*x509.Certificate) {
	certs = tidyBundle(certs, BundleOptions{Max: -1})
	if len(certs) == 0 {
		delete(data, SecretKeyRetiredCerts)
		return
	}
	data[SecretKeyRetiredCerts] = EncodeCertsPEM(certs)
}

// inUseCerts parses Serving and Draining certificates; unparsable ones are
// skipped (they cannot complete a handshake, so they need no CA).
func inUseCerts(s State) []*x509.Certificate {
	var out []*x509.Certificate
	for _, name := range slices.Sorted(maps.Keys(s.Serving)) {
		if c, err := ParseCertPEM(s.Serving[name].Cert); err == nil {
			out = append(out, c)
		}
	}
	for _, b := range s.Draining {
		if c, err := ParseCertPEM(b); err == nil {
			out = append(out, c)
		}
	}
	return out
}

func fingerprints(certs []*x509.Certificate) map[[sha256.Size]byte]bool {
	m := make(map[[sha256.Size]byte]bool, len(certs))
	for _, c := range certs {
		m[Fingerprint(c)] = true
	}
	return m
}

// sameFingerprints compares as sets: order and PEM formatting do not matter,
// so another tool re-encoding the same CAs causes no write.
func sameFingerprints(bundle []byte, want map[[sha256.Size]byte]bool) bool {
	if len(bundle) == 0 {
		return len(want) == 0
	}
	certs, err := ParseCertsPEM(bundle)
	if err != nil {
		return false
	}
	return maps.Equal(fingerprints(certs), want)
}

func problems(ca CASet) string {
	if len(ca.Problems) == 0 {
		return "missing"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(ca.Problems)) {
		parts = append(parts, k+": "+ca.Problems[k])
	}
	return strings.Join(parts, "; ")
}
