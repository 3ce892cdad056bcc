// Package integration proves the test harness is real: a real kube-apiserver
// calls webhook servers through Services with verified TLS (hookwright's
// servers as pods on a real node, toy webhooks as local processes), and kwok
// nodes heartbeat and run scheduled pods.
//
// Nothing imports it. It must not run the operator (controllers.Setup):
// that is test/operator's job; it imports controllers for its pure
// builders and names only.
package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/test/cluster"
)

var (
	env *cluster.Cluster
	// node runs the webhook servers' pods (servers_test.go).
	node *cluster.RealNode
	// serverImage is the operator image as the node pulls it.
	serverImage = ociimage.OperatorName
)

func TestMain(m *testing.M) {
	ctx := context.Background()
	start := time.Now()
	root, err := cluster.RealNodeRepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, err := os.MkdirTemp("", "hw-it-images-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	reg, _, err := ociimage.Serve(ctx, ociimage.Options{Root: root, BinDir: bin}, ociimage.SetOperator)
	_ = os.RemoveAll(bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "operator image:", err)
		os.Exit(1)
	}
	fmt.Printf("cluster: operator image built and pushed in %s\n", time.Since(start).Round(time.Millisecond))
	env, err = cluster.New(ctx, cluster.Options{
		ControllerManager:    true,
		Scheduler:            true,
		ServiceAccountTokens: true,
		Nodes: []cluster.NodeSpec{
			{Name: "kwok-node-0", Labels: map[string]string{"pool": "test"}},
			{Name: "kwok-node-1", Labels: map[string]string{"pool": "test"}},
		},
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start cluster:", err)
		os.Exit(1)
	}
	code := 1
	// Tainted: only the servers' pods (which tolerate it) run there; the
	// other tests' pods stay on kwok nodes.
	node, err = env.StartRealNode(ctx, cluster.RealNodeSpec{Name: "it-node-0", Registry: reg.Addr,
		Taints: []corev1.Taint{{Key: serverTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start real node:", err)
	} else {
		fmt.Printf("cluster: all components and the real node ready in %s\n", time.Since(start).Round(time.Millisecond))
		code = m.Run()
	}
	for _, f := range atExit {
		f()
	}
	cluster.RemoveHookwrightBinary()
	// Nothing may outlive Stop: no component process, nothing of the real
	// node, no temp dir.
	if !env.StopChecked(os.Stderr) {
		code = 1
	}
	reg.Close()
	os.Exit(code)
}

// toyMWC registers the toy webhook for resources (e.g. "configmaps",
// "nodes/status") behind Service ns/name with caBundle.
func toyMWC(name, ns, svc string, caBundle []byte, resources []string, ops []admissionregistrationv1.OperationType, fp admissionregistrationv1.FailurePolicyType, nsSel *metav1.LabelSelector) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: name + ".toy.hookwright.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svc, Path: ptr.To("/mutate"), Port: ptr.To[int32](443)},
				CABundle: caBundle,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: ops,
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: resources},
			}},
			NamespaceSelector:       nsSel,
			FailurePolicy:           &fp,
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](5),
		}},
	}
}

func TestWebhookThroughServiceWithVerifiedTLS(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 2*time.Minute)
	c := env.Client
	if _, err := env.CreateNamespace(ctx, "toy-system", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreateNamespace(ctx, "toy-target", map[string]string{"toy": "on"}); err != nil {
		t.Fatal(err)
	}
	ca, err := cluster.NewTestCA("toy-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := cluster.StartToyWebhook(ca, cluster.ServiceDNSNames("toy-system", "toy")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	svc, err := env.ExposeLocal(ctx, "toy-system", "toy", 443, srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("%s:443", svc.Spec.ClusterIP)

	nsSel := &metav1.LabelSelector{MatchLabels: map[string]string{"toy": "on"}}
	mwc := toyMWC("toy-configmaps", "toy-system", "toy", ca.CertPEM, []string{"configmaps"},
		[]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, admissionregistrationv1.Fail, nsSel)
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}

	// The webhook configuration takes effect asynchronously: retry creates.
	var cm *corev1.ConfigMap
	err = cluster.WaitFor(ctx, 30*time.Second, "a ConfigMap mutated by the toy webhook", func(ctx context.Context) (bool, error) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: "toy-target"}}
		if err := c.Create(ctx, cm); err != nil {
			return false, err
		}
		return cm.Labels["toy.hookwright.io/mutated"] == "true", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if srv.Calls("configmaps") == 0 || env.Egress.Hits(target) == 0 {
		t.Fatalf("webhook calls = %d, egress CONNECTs to %s = %d; want both > 0", srv.Calls("configmaps"), target, env.Egress.Hits(target))
	}

	// A caBundle that did not sign the server certificate must fail the call
	// with an x509 error: proof that TLS is verified end to end.
	other, err := cluster.NewTestCA("other-ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(mwc), mwc); err != nil {
		t.Fatal(err)
	}
	mwc.Webhooks[0].ClientConfig.CABundle = other.CertPEM
	if err := c.Update(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	err = cluster.WaitFor(ctx, 30*time.Second, "an x509 error from the webhook call", func(ctx context.Context) (bool, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: "toy-target"}}
		lastErr = c.Create(ctx, cm)
		return lastErr != nil && strings.Contains(lastErr.Error(), "x509"), nil
	})
	if err != nil {
		t.Fatalf("%v (last create error: %v)", err, lastErr)
	}
	t.Logf("wrong caBundle rejected as expected: %v", lastErr)

	// A namespace outside the selector is not affected even now.
	free := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "free", Namespace: "default"}}
	if err := c.Create(ctx, free); err != nil {
		t.Fatalf("create outside the namespaceSelector: %v", err)
	}
	if err := c.Delete(ctx, mwc); err != nil {
		t.Fatal(err)
	}

	// bin/kubectl works with the admin kubeconfig and sees the stamped version.
	// Stdout only: against an older server (make test-compat) kubectl
	// warns on stderr that the skew exceeds one minor.
	var stderr strings.Builder
	kv := exec.CommandContext(ctx, env.Bin+"/k8s/kubectl", "--kubeconfig", env.Kubeconfig, "version", "-o", "json")
	kv.Stderr = &stderr
	out, err := kv.Output()
	if err != nil {
		t.Fatalf("kubectl version: %v\n%s%s", err, out, stderr.String())
	}
	// The server is the minor make test-compat chose (cluster.KubeVersionEnv).
	var v struct {
		Client struct{ GitVersion string } `json:"clientVersion"`
		Server struct{ GitVersion string } `json:"serverVersion"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("kubectl version -o json: %v\n%s", err, out)
	}
	wantServer := fmt.Sprintf("v1.%d.", env.KubeMinor())
	if v.Client.GitVersion != "v1.37.2" || !strings.HasPrefix(v.Server.GitVersion, wantServer) ||
		(env.KubeMinor() == cluster.CurrentMinor && v.Server.GitVersion != "v1.37.2") {
		t.Fatalf("kubectl version should report client v1.37.2 and server %s*:\n%s", wantServer, out)
	}
}

func TestKwokNodesHeartbeatAndRunPods(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client

	// Count nodes/status UPDATEs with a toy webhook (failurePolicy Ignore, as
	// an oversell webhook would be): heartbeats must reach admission.
	if _, err := env.CreateNamespace(ctx, "hb-system", nil); err != nil {
		t.Fatal(err)
	}
	ca, err := cluster.NewTestCA("hb-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := cluster.StartToyWebhook(ca, cluster.ServiceDNSNames("hb-system", "hb")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if _, err := env.ExposeLocal(ctx, "hb-system", "hb", 443, srv.Addr); err != nil {
		t.Fatal(err)
	}
	mwc := toyMWC("toy-node-status", "hb-system", "hb", ca.CertPEM, []string{"nodes/status"},
		[]admissionregistrationv1.OperationType{admissionregistrationv1.Update}, admissionregistrationv1.Ignore, nil)
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), mwc) })

	before := map[string]time.Time{}
	for _, n := range []string{"kwok-node-0", "kwok-node-1"} {
		ready, err := env.NodeReady(ctx, n)
		if err != nil || !ready {
			t.Fatalf("node %s Ready=%v err=%v", n, ready, err)
		}
		before[n] = readyHeartbeat(t, ctx, n)
	}
	err = cluster.WaitFor(ctx, 60*time.Second, "kwok heartbeats through nodes/status admission on both nodes", func(ctx context.Context) (bool, error) {
		if srv.Calls("nodes/status") < 2 {
			return false, nil
		}
		for n, t0 := range before {
			node := &corev1.Node{}
			if err := c.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
				return false, err
			}
			if node.Labels["toy.hookwright.io/mutated"] != "true" {
				return false, nil
			}
			if !heartbeatOf(node).After(t0) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v (nodes/status reviews seen: %d)", err, srv.Calls("nodes/status"))
	}
	t.Logf("nodes/status reviews seen: %d", srv.Calls("nodes/status"))

	// A Deployment of 3 replicas: the controller-manager makes the pods, the
	// scheduler binds them to kwok nodes, kwok marks them Running.
	if _, err := env.CreateNamespace(ctx, "apps", nil); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "web", Image: "nginx:1.23-alpine"}},
					// kwok nodes carry no taints, but a real node might.
					Tolerations: []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
				},
			},
		},
	}
	if err := c.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	err = cluster.WaitFor(ctx, 90*time.Second, "3 Running pods on kwok nodes", func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, &pods, client.InNamespace("apps"), client.MatchingLabels(labels)); err != nil {
			return false, err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && strings.HasPrefix(p.Spec.NodeName, "kwok-node-") {
				running++
			}
		}
		return running == 3, nil
	})
	if err != nil {
		for _, p := range pods.Items {
			t.Logf("pod %s phase=%s node=%q", p.Name, p.Status.Phase, p.Spec.NodeName)
		}
		t.Fatal(err)
	}
}

func readyHeartbeat(t *testing.T, ctx context.Context, name string) time.Time {
	t.Helper()
	node := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		t.Fatal(err)
	}
	return heartbeatOf(node)
}

func heartbeatOf(node *corev1.Node) time.Time {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}
