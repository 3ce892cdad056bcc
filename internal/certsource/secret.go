package certsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/certs"
	"github.com/hookwright/hookwright/internal/desired"
)

// userSecretResync is how often a user-provided serving Secret (mode
// Secret) is read again besides its watch events.
const userSecretResync = 5 * time.Minute

// userSecret is mode Secret: the user provides the serving Secret; the
// operator only checks it and publishes its ca.crt.
type userSecret struct{ env Env }

// Certificate reads the user's Secret uncached (it carries no operator
// label, so the cache does not hold it) and checks it.
func (u *userSecret) Certificate(ctx context.Context, cr desired.CR, _ Apply) (State, error) {
	sec, err := secretOrNil(ctx, u.env.APIReader, client.ObjectKey{Namespace: desired.ServerNamespace(cr, u.env.Settings), Name: cr.Certificate.SecretName})
	if err != nil {
		return State{}, err
	}
	st := userSecretState(cr, u.env.Settings, sec, u.env.Certificates.Now())
	// The user's Secret is watched (metadata only); look again
	// periodically as well, in case a watch event was missed.
	st.RequeueAfter = userSecretResync
	return st, nil
}

// userSecretState checks a user-provided serving Secret (mode Secret):
// tls.crt, tls.key and ca.crt must be present, the key must match, and the
// certificate must verify for "<svc>.<ns>.svc" against ca.crt at now, as the
// API server will check it.
func userSecretState(cr desired.CR, s desired.Settings, secret *corev1.Secret, now time.Time) State {
	ns := desired.ServerNamespace(cr, s)
	if secret == nil {
		return State{Reason: ReasonSecretMissing, Message: fmt.Sprintf("Secret %s/%s not found", ns, cr.Certificate.SecretName)}
	}
	bad := func(err error) State {
		return State{Reason: reasonSecretInvalid, Message: fmt.Sprintf("Secret %s/%s: %v", ns, secret.Name, err)}
	}
	bundle := secret.Data[desired.SecretKeyCA]
	if len(bundle) == 0 {
		return bad(errors.New("no ca.crt"))
	}
	kp, err := certs.ParseKeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return bad(err)
	}
	host := certs.ServingDNSNames(cr.Base(), ns, "")[0]
	if err := certs.VerifyServing(kp.Cert, bundle, host, now); err != nil {
		return bad(fmt.Errorf("tls.crt does not verify for %s against ca.crt: %w", host, err))
	}
	return State{
		CABundle: bundle, Publish: publishWithOverlap, NotAfter: kp.Cert.NotAfter, RenewAt: certs.RenewalTime(kp.Cert, 0),
		Ready: true, Reason: ReasonValid,
		Message: fmt.Sprintf("user-provided serving certificate %s/%s valid until %s", ns, secret.Name, fmtTime(kp.Cert.NotAfter)),
	}
}
