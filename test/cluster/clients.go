package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Impersonate returns a copy of the admin config that acts as user in groups
// (system:authenticated is added as the authenticator would).
func (c *Cluster) Impersonate(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	return cfg
}

// KubeletConfig is a config acting as node's kubelet: user system:node:<node>
// in group system:nodes, as the node authorizer and NodeRestriction expect.
func (c *Cluster) KubeletConfig(node string) *rest.Config {
	return c.Impersonate("system:node:"+node, "system:nodes")
}

// CreateNamespace creates a namespace with labels (a test's namespaces are
// gone with the cluster, so nothing deletes them); with ServiceAccountTokens
// it returns once the namespace's default ServiceAccount exists.
func (c *Cluster) CreateNamespace(ctx context.Context, name string, labels map[string]string) (*corev1.Namespace, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := c.Client.Create(ctx, ns); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	if c.opts.ServiceAccountTokens {
		// The ServiceAccount admission plugin refuses pods until
		// kube-controller-manager has made the namespace's "default".
		if err := WaitFor(ctx, time.Minute, "ServiceAccount "+name+"/default", func(ctx context.Context) (bool, error) {
			err := c.Client.Get(ctx, client.ObjectKey{Namespace: name, Name: "default"}, &corev1.ServiceAccount{})
			return err == nil, client.IgnoreNotFound(err)
		}); err != nil {
			return nil, err
		}
	}
	return ns, nil
}

// WarningsClient is an admin client whose API server warnings (kubectl's
// "Warning: ..." lines) are recorded in the Warnings it returns, one per
// test (tests run in parallel); it fails t on error.
func (c *Cluster) WarningsClient(t testing.TB) (client.Client, *Warnings) {
	t.Helper()
	w := &Warnings{}
	cfg := rest.CopyConfig(c.Config)
	cfg.WarningHandlerWithContext = w
	wc, err := client.New(cfg, client.Options{Scheme: c.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return wc, w
}

// Warnings records the warnings the API server returns to a client (what
// kubectl prints as "Warning: ..."); set it as a rest.Config's
// WarningHandlerWithContext. Safe for concurrent use.
type Warnings struct {
	mu   sync.Mutex
	msgs []string
}

// HandleWarningHeaderWithContext records msg (rest.WarningHandlerWithContext).
func (w *Warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

// Take returns the warnings recorded since the last Take.
func (w *Warnings) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}
