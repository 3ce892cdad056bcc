package sources

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
)

// selfSigned is mode SelfSigned: the operator issues the serving
// certificate from the installation CA (CAReconciler) and publishes the CA
// bundle the planner keeps (internal/pki.Plan).
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
		if st.Kind == pki.StepPublishBundle && st.Rotating {
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
