package controllers

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hookwright/hookwright/internal/certs"
)

// Serving Secret annotations that keep a replaced serving certificate
// trusted while pods may still serve it (certs.State.Draining).
const (
	// AnnotationDrainingCerts holds the replaced certificate(s) (PEM).
	AnnotationDrainingCerts = "admission.hookwright.io/draining-certificates"
	// AnnotationDrainingUntil is when they stop counting (RFC 3339).
	AnnotationDrainingUntil = "admission.hookwright.io/draining-until"
)

// DefaultDrainGrace covers the kubelet's update of a mounted Secret (its
// sync period plus cache TTL, about 1–2 min) and certwatcher's reload.
const DefaultDrainGrace = 5 * time.Minute

// rotationPoll is how often a reconcile looks again while a rotation waits
// on other CRs (their configurations or serving certificates).
const rotationPoll = time.Second

// CertificateSettings tune SelfSigned mode.
type CertificateSettings struct {
	// Policy sets CA and serving lifetimes, rotation points and the delay
	// before a published next CA signs; zero fields take internal/certs
	// defaults (CA 5 years, rotated at 2/3; serving 90 days, renewed at 2/3;
	// promote 10 s after publishing).
	Policy certs.Policy
	// Clock is the time of certificate decisions; nil is the system clock.
	Clock certs.Clock
	// DrainGrace is how long a replaced serving certificate keeps its CA in
	// the caBundle (pods reload the mounted Secret with a delay); 0 means
	// DefaultDrainGrace.
	DrainGrace time.Duration
}

func (c CertificateSettings) drainGrace() time.Duration {
	if c.DrainGrace <= 0 {
		return DefaultDrainGrace
	}
	return c.DrainGrace
}

// CertInputs is the installation-wide certificate state one reconcile sees.
type CertInputs struct {
	// Own is the key of the reconciled CR's serving certificate in
	// State.Serving, OwnConfig of its configuration in State.Published
	// (absent there while the configuration does not exist).
	Own, OwnConfig string
	// State: the CA Secret data, the caBundle of every existing SelfSigned
	// configuration as read back, every SelfSigned serving certificate, and
	// the draining ones.
	State certs.State
	// Extra are CAs (PEM) published besides the operator's (--ca-dir); they
	// must already be filtered out of State.Published (see PlannerView).
	Extra []byte
	Now   time.Time
	// Settings of SelfSigned mode.
	Settings CertificateSettings
}

// CertOutcome is what one reconcile does about certificates.
type CertOutcome struct {
	// CA is the CA Secret data to write; nil when unchanged.
	CA map[string][]byte
	// Steps applied in this reconcile, in order (CreateCA, CreateNextCA,
	// PromoteNextCA, DropRetiredCA, PublishBundle of the Secret or own
	// configuration, IssueServing of the own certificate).
	Steps []certs.Step
	// Last is the step the planner stopped at: None, or one waiting on
	// other CRs or on the own configuration being observed.
	Last certs.Step
	// Serving is the own serving certificate and key (empty when not issued yet).
	Serving certs.Serving
	// IssueReason is set (a certs.Reason* constant) when Serving was issued now.
	IssueReason string
	// Draining are certificates the own server may still present (PEM
	// bundle) until DrainingUntil; nil when none.
	Draining      []byte
	DrainingUntil time.Time
	// Bundle is the caBundle to publish: the planner's CAs and Extra, tidied
	// (deduplicated, newest first); nil when no CA is usable.
	Bundle []byte
	// RequeueAfter is when to look again (0: on events only).
	RequeueAfter time.Duration
}

// AdvanceCertificates runs certs.Plan and certs.Apply until the plan needs
// something this reconcile cannot do or observe: a configuration of another
// CR to be republished, another CR's certificate to be issued, or its own
// configuration written and read back. It applies installation-wide steps
// (CA creation, staging, promotion, dropping) and only the own share of
// per-CR steps, so two CRs never write each other's objects. It only
// computes; the caller writes CA and the own objects. The error is a
// certificate generation failure or certs.ErrBundleTooLarge.
func AdvanceCertificates(in CertInputs) (CertOutcome, error) {
	var out CertOutcome
	st := in.State
	pol := in.Settings.Policy
	var planBundle []byte
	for range 12 {
		step, err := certs.Plan(st, in.Now, pol)
		if err != nil {
			return out, err
		}
		out.Last = step
		if len(step.Bundle) > 0 {
			planBundle = step.Bundle
		}
		done := false
		switch step.Kind {
		case certs.StepCreateCA, certs.StepCreateNextCA, certs.StepPromoteNextCA, certs.StepDropRetiredCA:
			if st, err = certs.Apply(st, step, in.Now, pol); err != nil {
				return out, err
			}
			out.CA = st.CA
			out.Steps = append(out.Steps, step)
		case certs.StepPublishBundle:
			own := slices.Contains(step.Configs, in.OwnConfig)
			mine := step
			mine.Configs = nil
			if own {
				mine.Configs = []string{in.OwnConfig}
			}
			if own || step.SecretBundleStale {
				if st, err = certs.Apply(st, mine, in.Now, pol); err != nil {
					return out, err
				}
				out.Steps = append(out.Steps, mine)
			}
			if step.SecretBundleStale {
				out.CA = st.CA
			}
			// Stop once the own configuration is to be written: the next
			// steps may only follow once it is read back from the API.
			if own || len(step.Configs) > 0 {
				out.RequeueAfter = rotationPoll
				done = true
			}
		case certs.StepIssueServing:
			if !slices.Contains(step.Targets, in.Own) {
				if step.Rotating {
					out.RequeueAfter = rotationPoll
				}
				done = true
				break
			}
			mine := step
			mine.Targets = []string{in.Own}
			prev := st.Serving[in.Own].Cert
			if st, err = certs.Apply(st, mine, in.Now, pol); err != nil {
				return out, err
			}
			out.Steps = append(out.Steps, mine)
			out.IssueReason = step.TargetReasons[in.Own]
			if _, perr := certs.ParseCertPEM(prev); perr == nil {
				// Pods serve the replaced certificate until they reload.
				st.Draining = append(slices.Clone(st.Draining), prev)
				out.Draining = append(out.Draining, prev...)
				out.DrainingUntil = in.Now.Add(in.Settings.drainGrace())
			}
		default: // StepNone
			out.RequeueAfter = step.RequeueAfter
			done = true
		}
		if done {
			break
		}
	}
	out.Serving = st.Serving[in.Own]
	if len(planBundle) == 0 {
		planBundle = st.CA[certs.SecretKeyBundle]
	}
	if len(planBundle) > 0 {
		out.Bundle = unionBundle(planBundle, in.Extra)
	}
	return out, nil
}

// unionBundle is the published caBundle: every CA of a and b, deduplicated,
// newest first, no cap (the planner already caps its own CAs).
func unionBundle(a, b []byte) []byte {
	var all []*x509.Certificate
	for _, p := range [][]byte{a, b} {
		if cs, err := certs.ParseCertsPEM(p); err == nil {
			all = append(all, cs...)
		}
	}
	return certs.BuildBundle(all, certs.BundleOptions{Max: -1})
}

// PlannerView removes from a published caBundle the CAs that only come from
// extra (the --ca-dir bundle), so the planner compares the configuration
// against its own CAs: those in the CA Secret (active, next, retired, ca.crt)
// stay even when extra has them too, as in-cluster the ca-dir is that very
// Secret mounted. An unparsable bundle is returned as is.
func PlannerView(published, extra []byte, caData map[string][]byte) []byte {
	ex, err := certs.ParseCertsPEM(extra)
	if err != nil || len(published) == 0 {
		return published
	}
	pub, err := certs.ParseCertsPEM(published)
	if err != nil {
		return published
	}
	own := map[[32]byte]bool{}
	for _, k := range []string{certs.SecretKeyActiveCert, certs.SecretKeyNextCert, certs.SecretKeyRetiredCerts, certs.SecretKeyBundle} {
		if cs, err := certs.ParseCertsPEM(caData[k]); err == nil {
			for _, c := range cs {
				own[certs.Fingerprint(c)] = true
			}
		}
	}
	extraOnly := map[[32]byte]bool{}
	for _, c := range ex {
		if fp := certs.Fingerprint(c); !own[fp] {
			extraOnly[fp] = true
		}
	}
	kept := slices.DeleteFunc(pub, func(c *x509.Certificate) bool { return extraOnly[certs.Fingerprint(c)] })
	return certs.EncodeCertsPEM(kept)
}

// DrainingFromAnnotations returns the draining certificates recorded on a
// serving Secret if their grace period has not ended at now.
func DrainingFromAnnotations(ann map[string]string, now time.Time) ([]byte, time.Time) {
	until, err := time.Parse(time.RFC3339, ann[AnnotationDrainingUntil])
	if err != nil || !now.Before(until) || ann[AnnotationDrainingCerts] == "" {
		return nil, time.Time{}
	}
	return []byte(ann[AnnotationDrainingCerts]), until
}

// splitPEM returns each CERTIFICATE of a PEM bundle as its own PEM.
func splitPEM(b []byte) [][]byte {
	cs, err := certs.ParseCertsPEM(b)
	if err != nil {
		return nil
	}
	out := make([][]byte, 0, len(cs))
	for _, c := range cs {
		out = append(out, certs.EncodeCertPEM(c))
	}
	return out
}

// describeSteps renders applied steps for a condition message.
func describeSteps(steps []certs.Step, last certs.Step) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, fmt.Sprintf("%s (%s)", s.Kind, s.Reason))
	}
	msg := ""
	if len(parts) > 0 {
		msg = "applied " + strings.Join(parts, ", ") + "; "
	}
	if last.Kind != certs.StepNone && last.Kind != "" {
		msg += fmt.Sprintf("waiting: %s (%s): %s", last.Kind, last.Reason, last.Message)
		if len(last.Configs) > 0 {
			msg += " " + fmt.Sprint(last.Configs)
		}
		if len(last.Targets) > 0 {
			msg += " " + fmt.Sprint(last.Targets)
		}
		msg += "; "
	} else if last.Rotating {
		msg += "CA rotation in progress: " + last.Message + "; "
	}
	return msg
}
