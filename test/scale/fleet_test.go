package scale

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	namespace   = "hookwright-scale"
	serviceName = "oversell"
	webhookName = "oversell.scale.hookwright.io"
	// fleetLabel marks the fleet's nodes; the webhook and the NodeOversell
	// select them by it.
	fleetLabel = "scale.hookwright.io/fleet"
	noName     = "scale"
)

// Every fleet node: 4 cpu, 8Gi, 3800m and 7Gi allocatable (the kubelet's
// reservations), so cpu ratio r publishes 3800m × r.
var (
	nodeCapacity    = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
	nodeAllocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3800m"), corev1.ResourceMemory: resource.MustParse("7Gi"), corev1.ResourcePods: resource.MustParse("110")}
)

// server is one `hookwright oversell` process.
type server struct {
	proc        *cluster.Process
	addr        string // webhook listener
	metricsPort int
}

// startServer runs `hookwright oversell` with the admin kubeconfig, the
// serving certificate in certDir and extra flags, and waits until ready.
func startServer(t *testing.T, ctx context.Context, name, certDir string, extra ...string) *server {
	t.Helper()
	port, metrics, probe := cluster.MustFreePort(t), cluster.MustFreePort(t), cluster.MustFreePort(t)
	args := append([]string{"oversell", "--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", port), "--cert-dir=" + certDir,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe)}, extra...)
	p, err := cluster.StartProcess("oversell-"+name, t.TempDir(), cluster.MustHookwrightBinary(t), args, []string{"KUBECONFIG=" + env.Kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s server log tail:\n%s", name, p.Tail(4000))
		}
		_ = p.Stop(5 * time.Second)
	})
	waitFor(t, ctx, time.Minute, name+" server ready", p.ProbeOK(probe, "/readyz"))
	return &server{proc: p, addr: fmt.Sprintf("127.0.0.1:%d", port), metricsPort: metrics}
}

// setup creates the namespace, a serving certificate, the Service (routed
// by the caller) and the MutatingWebhookConfiguration on nodes/status
// UPDATE of the fleet's nodes, as the operator configures it (failurePolicy
// Ignore). It returns the certificate directory and the Service.
func setup(t *testing.T, ctx context.Context) (string, *corev1.Service) {
	t.Helper()
	if _, err := env.CreateNamespace(ctx, namespace, nil); err != nil {
		t.Fatal(err)
	}
	ca, err := cluster.NewTestCA("scale-ca")
	if err != nil {
		t.Fatal(err)
	}
	certDir := filepath.Join(t.TempDir(), "certs")
	if err := ca.WriteServing(certDir, cluster.ServiceDNSNames(namespace, serviceName)...); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: serviceName},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}},
	}
	if err := env.Client.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	mwc := cluster.OversellWebhook("hookwright-scale", webhookName, namespace, serviceName, ca.CertPEM, 5)
	mwc.Webhooks[0].ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: fleetLabel, Operator: metav1.LabelSelectorOpExists}}}
	if err := env.Client.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.Client.Delete(ctx, mwc)
		_ = env.Client.Delete(ctx, svc)
		_ = env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	})
	return certDir, svc
}

// startFleet registers n nodes (labelled fleetLabel=fleet) and starts
// their heartbeats; the test's end stops them and deletes the nodes and
// their Leases.
func startFleet(t *testing.T, ctx context.Context, fleet string, n int) *cluster.Heartbeater {
	t.Helper()
	nodes := make([]cluster.KubeletNode, n)
	for i := range nodes {
		nodes[i] = cluster.KubeletNode{
			Name:     fmt.Sprintf("%s-%04d", fleet, i),
			Labels:   map[string]string{fleetLabel: fleet},
			Capacity: nodeCapacity, Allocatable: nodeAllocatable,
		}
	}
	hb, err := env.NewHeartbeater(ctx, nodes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := hb.Delete(ctx); err != nil {
			t.Errorf("delete fleet %s: %v", fleet, err)
		}
	})
	if err := hb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return hb
}

// createNodeOversell selects fleet with cpu ratio cpu; the test's end
// deletes it.
func createNodeOversell(t *testing.T, ctx context.Context, fleet, cpu string) *v1alpha1.NodeOversell {
	t.Helper()
	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: noName + "-" + fleet},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{fleetLabel: fleet}},
			Ratios:       v1alpha1.OversellRatios{CPU: v1alpha1.Ratio(cpu)},
		},
	}
	if err := env.Client.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), no) })
	return no
}

// waitServed waits until every server serves want NodeOversells.
func waitServed(t *testing.T, ctx context.Context, want int, servers ...*server) {
	t.Helper()
	for _, s := range servers {
		waitFor(t, ctx, 30*time.Second, fmt.Sprintf("server serving %d NodeOversells", want), func(ctx context.Context) (bool, error) {
			c, err := s.read(ctx)
			return err == nil && c.policies == float64(want), err
		})
	}
}

// setRatio changes no's cpu ratio.
func setRatio(t *testing.T, ctx context.Context, no *v1alpha1.NodeOversell, cpu string) {
	t.Helper()
	patch := client.MergeFrom(no.DeepCopy())
	no.Spec.Ratios.CPU = v1alpha1.Ratio(cpu)
	if err := env.Client.Patch(ctx, no, patch); err != nil {
		t.Fatal(err)
	}
}

// fleetCPU counts the fleet's nodes publishing allocatable cpu want.
func fleetCPU(ctx context.Context, fleet string, want resource.Quantity) (done, total int, err error) {
	var list corev1.NodeList
	if err := env.Client.List(ctx, &list, client.MatchingLabels{fleetLabel: fleet}); err != nil {
		return 0, 0, err
	}
	for _, n := range list.Items {
		if n.Status.Allocatable.Cpu().Cmp(want) == 0 {
			done++
		}
	}
	return done, len(list.Items), nil
}

// waitFleetCPU polls until all n nodes of fleet publish cpu want and
// returns how long that took.
func waitFleetCPU(t *testing.T, ctx context.Context, fleet string, n int, want string, timeout time.Duration) time.Duration {
	t.Helper()
	q := resource.MustParse(want)
	var done, total int
	took, err := cluster.Poll(ctx, 250*time.Millisecond, timeout, fmt.Sprintf("all %d nodes of %s at cpu %s", n, fleet, want), func(ctx context.Context) (bool, error) {
		d, tot, err := fleetCPU(ctx, fleet, q)
		if err == nil {
			done, total = d, tot
		}
		return err == nil && done == n && total == n, err
	})
	if err != nil {
		var sample string
		if node, gerr := getNode(context.Background(), fmt.Sprintf("%s-%04d", fleet, 0)); gerr == nil {
			sample = fmt.Sprintf("; %s: allocatable %v, annotations %v", node.Name, node.Status.Allocatable, node.Annotations)
		}
		t.Fatalf("%v (%d of %d)%s", err, done, total, sample)
	}
	return took
}

func waitFor(t *testing.T, ctx context.Context, d time.Duration, what string, cond cluster.Condition) {
	t.Helper()
	if err := cluster.WaitFor(ctx, d, what, cond); err != nil {
		t.Fatal(err)
	}
}

func getNode(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	return n, env.Client.Get(ctx, client.ObjectKey{Name: name}, n)
}

// readyHeartbeat is the stored Ready condition's lastHeartbeatTime.
func readyHeartbeat(n *corev1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}
