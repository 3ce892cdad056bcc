package sources

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

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
