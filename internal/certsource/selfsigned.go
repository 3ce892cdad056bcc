package certsource

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certs"
	"github.com/hookwright/hookwright/internal/desired"
)

// selfSigned is mode SelfSigned: the operator issues the serving
// certificate from the installation CA (CAReconciler) and publishes the CA
// bundle the planner keeps (internal/certs.Plan).
type selfSigned struct{ env Env }

// Certificate gathers the installation's certificate state, applies cr's
// share of the plan (publishing its configuration, issuing its serving
// certificate) and writes its serving Secret. Steps on the CA Secret are
// the CA controller's: cr waits for them (the CA Secret's watch event
// brings it back).
func (s *selfSigned) Certificate(ctx context.Context, cr desired.CR, apply Apply) (State, error) {
	now := s.env.Certificates.Now()
	g, err := gather(ctx, s.env, &cr, now)
	if err != nil {
		return State{}, err
	}
	own := servingKey(cr, s.env.Settings)
	out, err := advance(inputs{
		Role: ownCR, Own: own, OwnConfig: cr.Base(), Extra: s.env.extra(), Now: now,
		Settings: s.env.Certificates, State: g.State,
	})
	if err != nil {
		return State{Reason: ReasonCAUnusable, Message: err.Error()}, err
	}
	for _, st := range out.Steps {
		if st.Kind == certs.StepPublishBundle && st.Rotating {
			// A routine publish (a new or repaired configuration) is no rotation step.
			log.FromContext(ctx).Info("certificate step", "step", st.Kind, "reason", st.Reason, "message", st.Message)
			s.env.Recorder.Eventf(cr.Object, nil, corev1.EventTypeNormal, EventCARotation, string(st.Kind), "%s (%s): %s", st.Kind, st.Reason, st.Message)
		}
	}
	d := decideSelfSigned(cr, s.env.Settings, s.env.Certificates, out, g.Secrets[own], now)
	if d.secret == nil && g.Secrets[own] != nil {
		// No certificate to write now (no usable CA, or not issued yet):
		// the Secret servers mount stays until one is.
		d.Keep = []client.Object{g.Secrets[own]}
	}
	if d.secret != nil {
		if err := apply(ctx, d.secret); err != nil {
			return State{}, err
		}
		if d.issueReason != "" {
			s.env.Recorder.Eventf(cr.Object, nil, corev1.EventTypeNormal, EventCertificateIssued, "Issue",
				"serving certificate %s/%s issued (%s), valid until %s", d.secret.Namespace, d.secret.Name, d.issueReason, fmtTime(d.NotAfter))
		}
	}
	return d.State, nil
}

// selfSignedDecision is cr's SelfSigned state and the serving Secret to
// write (nil: none usable yet).
type selfSignedDecision struct {
	State
	secret      *corev1.Secret
	issueReason string
	steps       []certs.Step
}

// decideSelfSigned turns the planner's outcome into cr's serving Secret and
// CertificateReady. A certificate replaced in this reconcile, and one still
// draining from an earlier replacement, are recorded in the Secret's
// draining annotations until their grace period ends.
func decideSelfSigned(cr desired.CR, s desired.Settings, cs Settings, out outcome, current *corev1.Secret, now time.Time) selfSignedDecision {
	d := selfSignedDecision{steps: out.Steps}
	prefix := describeSteps(out.Steps, out.Last)
	if len(out.Bundle) == 0 {
		d.Reason, d.Message = ReasonCAUnusable, prefix+fmt.Sprintf("CA Secret %s/%s has no usable signing CA", s.Namespace, desired.CASecretName)
		return d
	}
	ns, name := desired.ServerNamespace(cr, s), desired.ServingSecretName(cr)
	cert, err := certs.ParseCertPEM(out.Serving.Cert)
	if err != nil {
		// The planner issues the certificate once the configuration, if it
		// exists, carries the bundle: publish it, or neither ever happens.
		d.CABundle, d.BundleOnly, d.RequeueAfter = out.Bundle, true, out.RequeueAfter
		d.Reason, d.Message = reasonNoCertificate, prefix+fmt.Sprintf("serving certificate %s/%s not issued yet", ns, name)
		return d
	}
	d.CABundle = out.Bundle
	d.secret = desired.ServingSecret(cr, s, out.Serving.Cert, out.Serving.Key, out.Bundle)
	d.Keep = []client.Object{d.secret}
	drain, until := out.Draining, out.DrainingUntil
	if current != nil {
		if old, oldUntil := drainingFromAnnotations(current.Annotations, now); old != nil {
			drain = append(slices.Clone(drain), old...)
			if until.IsZero() {
				until = oldUntil
			}
		}
	}
	d.RequeueAfter = out.RequeueAfter
	// The renew-now token the certificate answers: the CR's when issued
	// now, else the one recorded.
	handled := ""
	if current != nil {
		handled = current.Annotations[annotationRenewedFor]
	}
	if tok := cr.Object.GetAnnotations()[v1alpha1.AnnotationRenewCertificate]; tok != "" && out.IssueReason != "" {
		handled = tok
	}
	if handled != "" {
		d.secret.Annotations = map[string]string{annotationRenewedFor: handled}
	}
	if len(drain) > 0 {
		if d.secret.Annotations == nil {
			d.secret.Annotations = map[string]string{}
		}
		d.secret.Annotations[annotationDrainingCerts], d.secret.Annotations[annotationDrainingUntil] = string(drain), fmtTime(until)
		// The retired CA can be dropped once the grace period ends.
		d.RequeueAfter = minPositive(d.RequeueAfter, max(until.Sub(now), time.Second))
	}
	d.issueReason = out.IssueReason
	d.NotAfter, d.RenewAt = cert.NotAfter, certs.RenewalTime(cert, cs.Policy.ServingRenewFraction)
	d.Ready, d.Reason = true, ReasonValid
	if d.issueReason != "" {
		d.Reason = ReasonIssued
		prefix += "issued (" + out.IssueReason + "); "
	}
	d.Message = prefix + fmt.Sprintf("serving certificate %s/%s for %v valid until %s, renewal at %s",
		ns, name, out.Serving.DNSNames, fmtTime(d.NotAfter), fmtTime(d.RenewAt))
	return d
}

// minPositive is the smaller of a and b, ignoring values ≤ 0.
func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}
