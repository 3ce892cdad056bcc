package operator

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/test/cluster"
)

// `hookwright manager` itself starts with its flags, becomes leader on its
// Lease in --namespace and turns ready. (The other tests run the same
// controllers in-process, to count their writes; this one runs while no CR
// exists, so the two never act together.)
func TestManagerBinaryStartsAndLeads(t *testing.T) {
	ctx := cluster.TestContext(t, 2*time.Minute)
	probe := cluster.MustFreePort(t)
	p, err := cluster.StartProcess("manager", t.TempDir(), cluster.MustHookwrightBinary(t), []string{
		"manager", "--namespace=" + operatorNS, "--leader-elect=true", "--server-image=" + serverImage,
		"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
		// The in-process operator owns the validating webhook of this
		// cluster; the binary's server only binds a free port.
		fmt.Sprintf("--webhook-port=%d", cluster.MustFreePort(t)), "--webhook-service=",
	}, []string{"KUBECONFIG=" + env.Kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	ready := p.ProbeOK(probe, "/readyz")
	err = cluster.WaitFor(ctx, 60*time.Second, "manager ready and holding its Lease", func(ctx context.Context) (bool, error) {
		if ok, err := ready(ctx); !ok || err != nil {
			return false, err
		}
		lease := &coordinationv1.Lease{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: "hookwright.admission.hookwright.io"}, lease); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", nil
	})
	if err != nil {
		t.Fatalf("%v\nlog:\n%s", err, p.Tail(3000))
	}
	// Ready means the informer caches have synced, not only a ping.
	res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz?verbose", probe))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "[+]caches ok") {
		t.Fatalf("/readyz?verbose: %d\n%s", res.StatusCode, body)
	}
}
