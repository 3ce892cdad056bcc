// Package usage tests the NodeOversell the issue 19 way, on one cluster:
// the usage-aware ratio from metrics.k8s.io (metrics-server v0.9.0
// scraping kwok's emulated kubelet metrics and the real node's kubelet),
// its hysteresis and fallbacks, ratio cuts held for running pods (lowered
// ratio, narrowed selector, deletion) and across a kubelet restart,
// exclusive CPUs under the kubelet's static CPU manager, and the pressure
// back-off with a real CPU burner, against the real API server, the
// operator (in this process, as `hookwright manager` wires it) and the
// oversell server (`hookwright oversell`, with the operator's certificate
// and RBAC, behind its Service).
//
// The real node runs kubelet v1.37.2 with cpuManagerPolicy static and
// kubeReserved cpu 500m: on this machine's 2 cores its raw allocatable cpu
// is 1500m, and one CPU can be exclusive.
package usage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/cmd/app"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/serverpolicy"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	operatorNS  = "hookwright-system"
	serverImage = "ghcr.io/hookwright/hookwright:v0.0.0-test"
	realNode    = "real-node-0"
	// testTaint keeps the server Deployments' (kwok) pods off the nodes
	// the tests count requests on; the tests' pods tolerate it.
	testTaint = "hookwright.io/usage-test"
	workNS    = "usage"
)

var (
	env  *cluster.Cluster
	node *cluster.RealNode
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithCancel(context.Background())
	_, err := cluster.RealNodeRepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The host servers' binary, built while the cluster starts (the
	// first NodeOversell of each test waits for it otherwise); an error
	// shows where a test asks for it.
	go func() { _, _ = cluster.HookwrightBinary() }()
	taint := []corev1.Taint{{Key: testTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	start := time.Now()
	env, err = cluster.New(ctx, cluster.Options{
		ControllerManager: true, Scheduler: true, MetricsServer: true,
		Nodes: []cluster.NodeSpec{
			{Name: "sys-0", Labels: map[string]string{"pool": "system"}},
			{Name: "usage-0", Labels: map[string]string{"pool": "usage"}, Taints: taint},
			{Name: "hold-0", Labels: map[string]string{"pool": "hold", "zone": "a"}, Taints: taint},
			{Name: "hold-1", Labels: map[string]string{"pool": "hold", "zone": "b"}, Taints: taint},
		},
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start cluster:", err)
		os.Exit(1)
	}
	code := 1
	node, err = env.StartRealNode(ctx, cluster.RealNodeSpec{
		Name:   realNode,
		Labels: map[string]string{"pool": "real", v1alpha1.CPUManagerPolicyLabel: "static"},
		Taints: taint,
		// The suites' 4 s status and Lease periods (as test/node):
		// CutHeldAcrossKubeletRestart waits for the restarted kubelet's
		// heartbeat and two Lease renewals.
		Kubelet: cluster.KubeletOptions{
			CPUManagerPolicy: "static", KubeReservedCPU: "500m",
			NodeStatusUpdateFrequency: cluster.TestNodeStatusUpdateFrequency,
			NodeLeaseDurationSeconds:  cluster.TestNodeLeaseDurationSeconds,
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start real node:", err)
	} else if err := startOperator(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "start operator:", err)
	} else {
		fmt.Printf("figure: cluster, metrics-server, real node and operator up in %s\n", time.Since(start).Round(time.Millisecond))
		code = m.Run()
	}
	cancel()
	cluster.RemoveHookwrightBinary()
	if !env.StopChecked(os.Stderr) {
		code = 1
	}
	os.Exit(code)
}

// startOperator runs the production manager in this process, with the
// validating webhook on a local port behind its Service.
func startOperator(ctx context.Context) error {
	if _, err := env.CreateNamespace(ctx, operatorNS, nil); err != nil {
		return err
	}
	if _, err := env.CreateNamespace(ctx, workNS, nil); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(env.Dir, "logs", "operator.log"))
	if err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(f)))
	if err := controllers.AddToScheme(env.Scheme); err != nil {
		return err
	}
	servers, err := serverpolicy.New(operatorNS, serverImage, nil, nil)
	if err != nil {
		return err
	}
	port, err := cluster.FreePort()
	if err != nil {
		return err
	}
	mgr, err := app.New(env.Config, app.Options{
		Metrics: metricsserver.Options{BindAddress: "0"}, ProbeAddr: "0",
		WebhookHost: "127.0.0.1", WebhookPort: port, WebhookService: desired.DefaultWebhookService,
		Servers: servers,
		Settings: controllers.Settings{Settings: desired.Settings{
			Namespace: operatorNS, Image: serverImage,
			AllowedNamespaces: servers.Namespaces, AllowedImages: servers.Images,
		}},
	})
	if err != nil {
		return err
	}
	if _, err := env.ExposeLocal(ctx, operatorNS, desired.DefaultWebhookService, 443, fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return nil
}

// newOversell creates a NodeOversell (one server replica), starts its
// server on the host behind its Service, and waits until the operator
// has written its first targets; the test's end deletes it and waits
// until it is gone (its nodes restored).
func newOversell(t *testing.T, ctx context.Context, no *v1alpha1.NodeOversell) {
	t.Helper()
	no.Spec.Server.Replicas = ptrTo[int32](1)
	if err := env.Client.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, no) })
	base := desired.OversellKind.BaseName(no.Name)
	dep := &appsv1.Deployment{}
	svc := &corev1.Service{}
	sec := &corev1.Secret{}
	err := cluster.WaitFor(ctx, time.Minute, "server Deployment, Service and certificate of "+no.Name, func(ctx context.Context) (bool, error) {
		for _, o := range []struct {
			key client.ObjectKey
			obj client.Object
		}{{client.ObjectKey{Namespace: operatorNS, Name: base}, dep}, {client.ObjectKey{Namespace: operatorNS, Name: base}, svc},
			{client.ObjectKey{Namespace: operatorNS, Name: base + "-tls"}, sec}} {
			if err := env.Client.Get(ctx, o.key, o.obj); err != nil {
				return false, client.IgnoreNotFound(err)
			}
		}
		return len(sec.Data[corev1.TLSCertKey]) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	startServer(t, no.Name, dep.Spec.Template.Spec.Containers[0].Args, sec, svc)
	waitFor(t, ctx, 90*time.Second, no.Name+" webhook configured and its server available", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), no); err != nil {
			return false, err
		}
		return apimeta.IsStatusConditionTrue(no.Status.Conditions, v1alpha1.ConditionWebhookConfigured) &&
			apimeta.IsStatusConditionTrue(no.Status.Conditions, v1alpha1.ConditionServerAvailable), nil
	})
}

// deleteAndWait deletes no and waits until it is gone.
func deleteAndWait(t *testing.T, no *v1alpha1.NodeOversell) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.Client.Delete(ctx, no); client.IgnoreNotFound(err) != nil {
		t.Errorf("delete %s: %v", no.Name, err)
		return
	}
	if err := cluster.WaitFor(ctx, 2*time.Minute, no.Name+" gone", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), &v1alpha1.NodeOversell{})
		return err != nil && client.IgnoreNotFound(err) == nil, nil
	}); err != nil {
		t.Error(err)
	}
}

// startServer runs `hookwright oversell` with the Deployment's args, the
// operator's serving certificate and the server ServiceAccount's RBAC (by
// impersonation), and routes its Service to it.
func startServer(t *testing.T, name string, args []string, sec *corev1.Secret, svc *corev1.Service) {
	t.Helper()
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string][]byte{"tls.crt": sec.Data[corev1.TLSCertKey], "tls.key": sec.Data[corev1.TLSPrivateKeyKey]} {
		if err := os.WriteFile(filepath.Join(certs, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	sa := desired.OversellKind.BaseName(name)
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + operatorNS + ":" + sa
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + operatorNS, "system:authenticated"}
	}
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kcPath); err != nil {
		t.Fatal(err)
	}
	port, probe := cluster.MustFreePort(t), cluster.MustFreePort(t)
	all := append(append([]string(nil), args...), "--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", port),
		"--cert-dir="+certs, "--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe))
	p, err := cluster.StartProcess("oversell-"+name, dir, cluster.MustHookwrightBinary(t), all, []string{"KUBECONFIG=" + kcPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	waitFor(t, cluster.TestContext(t, time.Minute), time.Minute, name+" server ready", p.ProbeOK(probe, "/readyz"))
	if err := env.RouteService(svc, fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(svc) })
}

func waitFor(t *testing.T, ctx context.Context, d time.Duration, what string, cond cluster.Condition) {
	t.Helper()
	if err := cluster.WaitFor(ctx, d, what, cond); err != nil {
		t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// pod is a test pod bound to node (no scheduler involved: the kubelet,
// or kwok, admits it), tolerating the test taint and our hold taint.
func pod(name, node string, req corev1.ResourceList, lim corev1.ResourceList, ann map[string]string, args ...string) *corev1.Pod {
	if len(args) == 0 {
		args = []string{"serve"}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: workNS, Name: name, Annotations: ann, Labels: map[string]string{"test": "usage"}},
		Spec: corev1.PodSpec{
			NodeName: node,
			Tolerations: []corev1.Toleration{
				{Key: testTaint, Operator: corev1.TolerationOpExists},
			},
			TerminationGracePeriodSeconds: ptrTo[int64](1),
			Containers: []corev1.Container{{
				Name: "main", Image: "ghcr.io/hookwright/standin:v1", ImagePullPolicy: corev1.PullNever, Args: args,
				Resources: corev1.ResourceRequirements{Requests: req, Limits: lim},
			}},
		},
	}
}

func cpuMem(cpu, mem string) corev1.ResourceList {
	l := corev1.ResourceList{}
	if cpu != "" {
		l[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		l[corev1.ResourceMemory] = resource.MustParse(mem)
	}
	return l
}

// nodeState is what the tests look at on a node.
type nodeState struct {
	cpu    string // allocatable
	target *v1alpha1.OversellTarget
	taint  string // our taint's value, "" when none
	label  string // OversellNodeLabel
	ratios string // OversellRatiosKey
}

func (s nodeState) String() string {
	src, ratio := "", ""
	if s.target != nil && s.target.CPU != nil {
		src, ratio = s.target.CPU.Source, s.target.CPU.Ratio
	}
	return fmt.Sprintf("allocatable cpu %s, target %s (%s), taint %q, label %q, ratios %s", s.cpu, ratio, src, s.taint, s.label, s.ratios)
}

func readNode(ctx context.Context, name string) (nodeState, error) {
	n := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		return nodeState{}, err
	}
	s := nodeState{cpu: n.Status.Allocatable.Cpu().String(), label: n.Labels[v1alpha1.OversellNodeLabel], ratios: n.Annotations[v1alpha1.OversellRatiosKey]}
	if v := n.Annotations[v1alpha1.OversellTargetKey]; v != "" {
		s.target = &v1alpha1.OversellTarget{}
		if err := jsonUnmarshal(v, s.target); err != nil {
			return s, err
		}
	}
	for _, tt := range n.Spec.Taints {
		if tt.Key == v1alpha1.OversellTaintKey {
			s.taint = tt.Value
		}
	}
	return s, nil
}

// waitNode polls node until ok holds and returns its state.
func waitNode(t *testing.T, ctx context.Context, d time.Duration, name, what string, ok func(nodeState) bool) nodeState {
	t.Helper()
	var last nodeState
	err := cluster.WaitFor(ctx, d, name+": "+what, func(ctx context.Context) (bool, error) {
		s, err := readNode(ctx, name)
		last = s
		return err == nil && ok(s), err
	})
	if err != nil {
		t.Fatalf("%v; last: %s", err, last)
	}
	return last
}

// waitCondition polls no until its condition typ has status st and its
// message contains every one of contains.
func waitCondition(t *testing.T, ctx context.Context, d time.Duration, no *v1alpha1.NodeOversell, typ string, st metav1.ConditionStatus, reason string, contains ...string) *metav1.Condition {
	t.Helper()
	var last *metav1.Condition
	err := cluster.WaitFor(ctx, d, fmt.Sprintf("%s %s=%s %s", no.Name, typ, st, reason), func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), no); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		last = apimeta.FindStatusCondition(no.Status.Conditions, typ)
		if last == nil || last.Status != st || (reason != "" && last.Reason != reason) {
			return false, nil
		}
		for _, c := range contains {
			if !strings.Contains(last.Message, c) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v; last: %+v", err, last)
	}
	return last
}

// createPods creates pods and waits until each runs.
func createPods(t *testing.T, ctx context.Context, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	}
	for _, p := range pods {
		waitFor(t, ctx, 2*time.Minute, "pod "+p.Name+" running", func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return false, err
			}
			if p.Status.Phase == corev1.PodFailed {
				return false, cluster.Permanent(fmt.Errorf("pod %s failed: %s %s", p.Name, p.Status.Reason, p.Status.Message))
			}
			return p.Status.Phase == corev1.PodRunning, nil
		})
	}
}

// deletePods deletes pods and waits until they are gone.
func deletePods(t *testing.T, ctx context.Context, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if err := env.Client.Delete(ctx, p, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		waitFor(t, ctx, 2*time.Minute, "pod "+p.Name+" gone", func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{})
			return err != nil && client.IgnoreNotFound(err) == nil, nil
		})
	}
}
