package sources

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// Serving Secret annotations that keep a replaced serving certificate
// trusted while pods may still serve it (pki.State.Draining).
const (
	// annotationDrainingCerts holds the replaced certificate(s) (PEM).
	annotationDrainingCerts = "admission.hookwright.io/draining-certificates"
	// annotationDrainingUntil is when they stop counting (RFC 3339).
	annotationDrainingUntil = "admission.hookwright.io/draining-until"
)

// rotationPoll is how often a reconcile looks again while a rotation waits
// on other CRs (their configurations or serving certificates).
const rotationPoll = time.Second

// role is whose share of the plan a reconcile applies.
type role int

const (
	// installation: the CA controller applies the steps on the CA Secret
	// (CreateCA, CreateNextCA, PromoteNextCA, DropRetiredCA, and refreshing
	// its ca.crt) and stops at every per-CR step.
	installation role = iota
	// ownCR: a CR's reconcile publishes its own configuration and issues
	// its own serving certificate, and stops at every CA Secret step.
	ownCR
)

// inputs is the installation-wide certificate state one reconcile sees.
type inputs struct {
	// Role is whose share of the plan is applied.
	Role role
	// Own is the key of the reconciled CR's serving certificate in
	// State.Serving, OwnConfig of its configuration in State.Published
	// (absent there while the configuration does not exist); empty for the
	// installation role.
	Own, OwnConfig string
	// State: the CA Secret data, the caBundle of every existing SelfSigned
	// configuration as read back, every SelfSigned serving certificate, and
	// the draining ones.
	State pki.State
	// Extra are CAs (PEM) published besides the operator's (--ca-dir); they
	// must already be filtered out of State.Published (see plannerView).
	Extra []byte
	Now   time.Time
	// Settings of SelfSigned mode.
	Settings Settings
}

// outcome is what one reconcile does about certificates.
type outcome struct {
	// CA is the CA Secret data to write; nil when unchanged (installation
	// role only).
	CA map[string][]byte
	// Steps applied in this reconcile, in order: CreateCA, CreateNextCA,
	// PromoteNextCA, DropRetiredCA and PublishBundle of the CA Secret's
	// ca.crt (installation); PublishBundle of the own configuration and
	// IssueServing of the own certificate (ownCR).
	Steps []pki.Step
	// Last is the step the planner stopped at: None, or one waiting on
	// the other role, on other CRs or on the own configuration being observed.
	Last pki.Step
	// Serving is the own serving certificate and key (empty when not issued yet).
	Serving pki.Serving
	// IssueReason is set (a pki.Reason* constant) when Serving was issued now.
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

// advance runs pki.Plan and pki.Apply until the plan needs something
// this reconcile cannot do or observe: a step of the other role, a
// configuration of another CR to be republished, another CR's certificate
// to be issued, or its own configuration written and read back. So two
// reconciles never write each other's objects: only the CA controller
// writes the CA Secret, only a CR's reconcile its own Secret and
// configuration. It only computes; the caller writes. The error is a
// certificate generation failure or pki.ErrBundleTooLarge.
func advance(in inputs) (outcome, error) {
	var out outcome
	st := in.State
	pol := in.Settings.Policy
	var planBundle []byte
	apply := func(step pki.Step) error {
		var err error
		st, err = pki.Apply(st, step, in.Now, pol)
		out.Steps = append(out.Steps, step)
		return err
	}
	for range 12 {
		step, err := pki.Plan(st, in.Now, pol)
		if err != nil {
			return out, err
		}
		out.Last = step
		if len(step.Bundle) > 0 {
			planBundle = step.Bundle
		}
		done := true
		switch {
		case step.Kind == pki.StepNone:
			out.RequeueAfter = step.RequeueAfter
		case isCAStep(step.Kind):
			if in.Role == installation {
				if err := apply(step); err != nil {
					return out, err
				}
				out.CA, done = st.CA, false
			}
		case step.Kind == pki.StepPublishBundle && in.Role == installation:
			if step.SecretBundleStale {
				mine := step
				mine.Configs = nil
				if err := apply(mine); err != nil {
					return out, err
				}
				out.CA, done = st.CA, len(step.Configs) > 0
			}
			if done && step.Rotating {
				out.RequeueAfter = rotationPoll
			}
		case step.Kind == pki.StepPublishBundle:
			if slices.Contains(step.Configs, in.OwnConfig) {
				mine := step
				mine.Configs, mine.SecretBundleStale = []string{in.OwnConfig}, false
				if err := apply(mine); err != nil {
					return out, err
				}
			}
			// Stop once a configuration is to be written: the next steps
			// may only follow once it is read back from the API.
			if len(step.Configs) > 0 {
				out.RequeueAfter = rotationPoll
			}
		case step.Kind == pki.StepIssueServing && in.Role == ownCR && slices.Contains(step.Targets, in.Own):
			mine := step
			mine.Targets = []string{in.Own}
			prev := st.Serving[in.Own].Cert
			if err := apply(mine); err != nil {
				return out, err
			}
			out.IssueReason = step.TargetReasons[in.Own]
			if _, perr := pki.ParseCertPEM(prev); perr == nil {
				// Pods serve the replaced certificate until they reload.
				st.Draining = append(slices.Clone(st.Draining), prev)
				out.Draining = append(out.Draining, prev...)
				out.DrainingUntil = in.Now.Add(in.Settings.Grace())
			}
			done = false
		case step.Kind == pki.StepIssueServing && step.Rotating:
			out.RequeueAfter = rotationPoll
		}
		if done {
			break
		}
	}
	if in.Role == ownCR {
		out.Serving = st.Serving[in.Own]
	}
	if len(planBundle) == 0 {
		planBundle = st.CA[pki.SecretKeyBundle]
	}
	if len(planBundle) > 0 {
		out.Bundle = unionBundle(planBundle, in.Extra)
	}
	return out, nil
}

// isCAStep reports whether k changes the CA Secret's CAs.
func isCAStep(k pki.StepKind) bool {
	switch k {
	case pki.StepCreateCA, pki.StepCreateNextCA, pki.StepPromoteNextCA, pki.StepDropRetiredCA:
		return true
	}
	return false
}

// unionBundle is the published caBundle: every CA of a and b, deduplicated,
// newest first, no cap (the planner already caps its own CAs).
func unionBundle(a, b []byte) []byte {
	var all []*x509.Certificate
	for _, p := range [][]byte{a, b} {
		if cs, err := pki.ParseCertsPEM(p); err == nil {
			all = append(all, cs...)
		}
	}
	return pki.BuildBundle(all, pki.BundleOptions{Max: -1})
}

// plannerView removes from a published caBundle the CAs that only come from
// extra (the --ca-dir bundle), so the planner compares the configuration
// against its own CAs: those in the CA Secret (active, next, retired, ca.crt)
// stay even when extra has them too, as in-cluster the ca-dir is that very
// Secret mounted. An unparsable bundle is returned as is.
func plannerView(published, extra []byte, caData map[string][]byte) []byte {
	ex, err := pki.ParseCertsPEM(extra)
	if err != nil || len(published) == 0 {
		return published
	}
	pub, err := pki.ParseCertsPEM(published)
	if err != nil {
		return published
	}
	own := map[[32]byte]bool{}
	for _, k := range []string{pki.SecretKeyActiveCert, pki.SecretKeyNextCert, pki.SecretKeyRetiredCerts, pki.SecretKeyBundle} {
		if cs, err := pki.ParseCertsPEM(caData[k]); err == nil {
			for _, c := range cs {
				own[pki.Fingerprint(c)] = true
			}
		}
	}
	extraOnly := map[[32]byte]bool{}
	for _, c := range ex {
		if fp := pki.Fingerprint(c); !own[fp] {
			extraOnly[fp] = true
		}
	}
	kept := slices.DeleteFunc(pub, func(c *x509.Certificate) bool { return extraOnly[pki.Fingerprint(c)] })
	return pki.EncodeCertsPEM(kept)
}

// drainingFromAnnotations returns the draining certificates recorded on a
// serving Secret if their grace period has not ended at now.
func drainingFromAnnotations(ann map[string]string, now time.Time) ([]byte, time.Time) {
	until, err := time.Parse(time.RFC3339, ann[annotationDrainingUntil])
	if err != nil || !now.Before(until) || ann[annotationDrainingCerts] == "" {
		return nil, time.Time{}
	}
	return []byte(ann[annotationDrainingCerts]), until
}

// splitPEM returns each CERTIFICATE of a PEM bundle as its own PEM.
func splitPEM(b []byte) [][]byte {
	cs, err := pki.ParseCertsPEM(b)
	if err != nil {
		return nil
	}
	out := make([][]byte, 0, len(cs))
	for _, c := range cs {
		out = append(out, pki.EncodeCertPEM(c))
	}
	return out
}

// describeSteps renders applied steps for a condition message.
func describeSteps(steps []pki.Step, last pki.Step) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, fmt.Sprintf("%s (%s)", s.Kind, s.Reason))
	}
	msg := ""
	if len(parts) > 0 {
		msg = "applied " + strings.Join(parts, ", ") + "; "
	}
	if last.Kind != pki.StepNone && last.Kind != "" {
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
