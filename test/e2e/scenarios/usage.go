package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/test/cluster"
)

// Scenario 9's objects.
const (
	usageNode      = "kwok-node-2"
	usageNamespace = "lab-usage"
	usageOversell  = "usage-demo"
	usageWorkload  = "busy"
	// usageBinding binds config/node-taints to the operator.
	usageBinding = "hookwright-node-taints-demo"
	// usageMinChange is the demo NodeOversell's minChangeInterval: short,
	// as each of the four steps waits it out; the check against the
	// operator's stamps is the same at any value.
	usageMinChange = 5 * time.Second
)

// UsageAware is scenario 9: on the operator install that runs (whichever
// scenario 5 left), a usage-aware NodeOversell (priority above the
// sample's, on one pool node) lowers the node's ratio as a workload's
// usage rises (kwok's usage annotations, measured by metrics-server) and
// raises it again after, within its hysteresis; then a cut of its ratio
// to 1 while the workload needs 6 CPUs of the node's 4 is held, without
// stranding a pod: kubectl apply warns naming the node and the excess,
// the node keeps 6 CPUs and our NoSchedule taint, RatioHeld names it, and
// once the workload shrinks the node is released. Everything it made is
// removed at its end.
func UsageAware(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster.Client
	defer e.cleanUsage(context.Background())
	if err := e.bindNodeTaints(ctx, r); err != nil {
		return err
	}
	if _, err := e.Cluster.CreateNamespace(ctx, usageNamespace, nil); err != nil {
		return err
	}
	if err := e.applyWorkload(ctx, 4); err != nil {
		return err
	}
	pods, err := e.waitWorkload(ctx, 4)
	if err != nil {
		return err
	}
	r.check("Deployment %s/%s: 4 pods of 1 CPU on %s (4 CPU raw), each using 100m (kwok.x-k8s.io/usage-cpu)", usageNamespace, usageWorkload, usageNode)
	// metrics-server needs two scrapes of a pod for its cpu rate.
	if err := cluster.WaitFor(ctx, 2*time.Minute, "pod metrics of "+usageWorkload, func(ctx context.Context) (bool, error) {
		b, err := e.Cluster.Clientset.CoreV1().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/namespaces/" + usageNamespace + "/pods/" + pods[0]).DoRaw(ctx)
		return err == nil && strings.Contains(string(b), `"cpu"`), nil
	}); err != nil {
		return err
	}

	manifest := usageManifest("2")
	start := time.Now()
	if _, _, err := e.RunKubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
		return err
	}
	if err := waitTarget(ctx, e, "ratio 2 (static), allocatable 8", 3*time.Minute, func(t *v1alpha1.OversellTarget, cpu string) bool {
		return cpu == "8" && t.CPU.Ratio == "2" && t.CPU.Source == v1alpha1.RatioSourceStatic
	}); err != nil {
		return err
	}
	r.timing("usage-aware NodeOversell applied → "+usageNode+" at spec.ratios 2 (8 CPU)", time.Since(start), 0)

	// Usage rises: 900m of each 1-CPU request.
	start = time.Now()
	// Every ratio the node goes through, stamped by the operator.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	steps, err := cluster.WatchRatios(sctx, e.Cluster.Clientset, usageNode)
	if err != nil {
		return err
	}
	if err := setUsage(ctx, e, pods, "900m"); err != nil {
		return err
	}
	if err := waitTarget(ctx, e, "ratio 1 (usage), allocatable 4", 3*time.Minute, func(t *v1alpha1.OversellTarget, cpu string) bool {
		return cpu == "4" && t.CPU.Ratio == "1" && t.CPU.Source == v1alpha1.RatioSourceUsage
	}); err != nil {
		return err
	}
	r.timing("usage 100m → 900m per pod: ratio 2 → 1 (source usage)", time.Since(start), 0)
	start = time.Now()
	if err := setUsage(ctx, e, pods, "100m"); err != nil {
		return err
	}
	if err := waitTarget(ctx, e, "ratio 2 again", 3*time.Minute, func(t *v1alpha1.OversellTarget, cpu string) bool {
		return cpu == "8" && t.CPU.Ratio == "2"
	}); err != nil {
		return err
	}
	r.timing("usage back to 100m: ratio 1 → 2", time.Since(start), 0)
	if err := cluster.WaitFor(ctx, time.Minute, "step log at 2", func(context.Context) (bool, error) {
		c, err := steps.Changes()
		return len(c) > 1 && c[len(c)-1].Ratio == "2", err
	}); err != nil {
		return err
	}
	stop()
	got, err := steps.Changes()
	if err != nil {
		return err
	}
	// The demo's steps are 0.5, so 2 → 1 → 2 passes 1.5 both ways.
	if err := cluster.CheckRatioSteps(got, []string{"2", "1.5", "1", "1.5", "2"}, 500_000, usageMinChange); err != nil {
		return err
	}
	r.check("ratio steps %s (the operator's stamps): at most maxStep 0.5, at least minChangeInterval %s apart", cluster.FormatRatioSteps(got), usageMinChange)

	// A cut held without stranding a pod.
	if err := e.applyWorkload(ctx, 6); err != nil {
		return err
	}
	if _, err := e.waitWorkload(ctx, 6); err != nil {
		return err
	}
	start = time.Now()
	_, stderr, err := e.RunKubectl(ctx, []byte(usageManifest("1")), "apply", "-f", "-")
	if err != nil {
		return err
	}
	want := usageNode + ": cpu: pods request 6 > 4 at 1; held at cpu 1.5"
	if !strings.Contains(stderr, want) {
		return fmt.Errorf("kubectl apply of cpu ratio 1 warned %q, want a warning with %q", stderr, want)
	}
	r.check("kubectl apply of cpu ratio 1 with 6 CPUs running: %q", warningWith(stderr, usageNode))
	if err := waitTarget(ctx, e, "held at 1.5 (6 CPU), tainted", time.Minute, func(t *v1alpha1.OversellTarget, cpu string) bool {
		return cpu == "6" && t.CPU.Ratio == "1.5" && t.Held != "" && hasOurTaint(ctx, e, v1alpha1.OversellTaintRatioCut)
	}); err != nil {
		return err
	}
	r.timing("ratio 2 → 1 applied: the node held at 1.5 (6 CPU) and tainted "+v1alpha1.OversellTaintKey+"=ratio-cut", time.Since(start), 0)
	no := &v1alpha1.NodeOversell{}
	if err := cluster.WaitFor(ctx, time.Minute, "RatioHeld True", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: usageOversell}, no); err != nil {
			return false, err
		}
		for _, cd := range no.Status.Conditions {
			if cd.Type == v1alpha1.ConditionRatioHeld {
				return cd.Status == metav1.ConditionTrue && strings.Contains(cd.Message, usageNode), nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	r.check("condition RatioHeld: %s", conditionMessage(no, v1alpha1.ConditionRatioHeld))
	if _, err := e.waitWorkload(ctx, 6); err != nil {
		return fmt.Errorf("after the cut: %w", err)
	}
	r.check("all 6 pods still running on %s: none evicted or stranded", usageNode)
	out, err := e.explainNode(ctx, usageNode)
	if err != nil {
		return err
	}
	for _, key := range []string{"effective allocatable:", "ratio:", "deciding NodeOversell:", "headroom:", "taint:"} {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, key) {
				line = strings.Join(strings.Fields(l), " ")
			}
		}
		if line == "" {
			return fmt.Errorf("hookwright explain-node %s printed no %q line:\n%s", usageNode, key, out)
		}
		r.check("hookwright explain-node %s: %s", usageNode, line)
	}

	start = time.Now()
	if err := e.applyWorkload(ctx, 4); err != nil {
		return err
	}
	if err := waitTarget(ctx, e, "released: ratio 1 (4 CPU), untainted", 2*time.Minute, func(t *v1alpha1.OversellTarget, cpu string) bool {
		return cpu == "4" && t.CPU.Ratio == "1" && t.Held == "" && !hasOurTaint(ctx, e, "")
	}); err != nil {
		return err
	}
	r.timing("workload scaled to 4 → hold released: ratio 1, 4 CPU, taint removed", time.Since(start), 0)
	return nil
}

// explainNode runs `hookwright explain-node NODE` with the admin
// kubeconfig; the binary is built once into the cluster's directory
// (removed with it).
func (e *Env) explainNode(ctx context.Context, node string) (string, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(e.Cluster.Dir, "hookwright")
	if _, err := os.Stat(bin); err != nil {
		if err := ociimage.OperatorBinary(ctx, root, runtime.GOARCH, "v0.0.0-dev", "unknown", bin); err != nil {
			return "", err
		}
	}
	cmd := exec.CommandContext(ctx, bin, "explain-node", node)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Cluster.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("hookwright explain-node %s: %w\n%s", node, err, out)
	}
	e.Logf("scenario 9: hookwright explain-node %s:\n%s", node, out)
	return string(out), nil
}

// usageManifest is the demo NodeOversell with the given cpu ratio.
func usageManifest(cpu string) string {
	return fmt.Sprintf(`apiVersion: admission.hookwright.io/v1alpha1
kind: NodeOversell
metadata:
  name: %s
spec:
  priority: 100
  nodeSelector:
    matchLabels:
      kubernetes.io/hostname: %s
  ratios:
    cpu: %q
  server:
    replicas: 1
  usage:
    targetUtilization: {cpu: 60}
    interval: 2s
    minChangeInterval: %s
    maxStep: "0.5"
    deadBand: "0.1"
    staleAfter: 1m
`, usageOversell, usageNode, cpu, usageMinChange)
}

// applyWorkload creates or scales the busy Deployment on usageNode.
func (e *Env) applyWorkload(ctx context.Context, replicas int) error {
	manifest := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %s, namespace: %s}
spec:
  replicas: %d
  selector: {matchLabels: {app: %s}}
  template:
    metadata:
      labels: {app: %s}
      annotations: {%s: 100m, %s: 64Mi}
    spec:
      nodeSelector: {kubernetes.io/hostname: %s}
      tolerations: [{key: %s, operator: Exists, effect: NoSchedule}]
      containers:
      - {name: main, image: %s, resources: {requests: {cpu: "1", memory: 64Mi}}}
`, usageWorkload, usageNamespace, replicas, usageWorkload, usageWorkload,
		cluster.KwokUsageCPUAnnotation, cluster.KwokUsageMemoryAnnotation, usageNode, PoolTaint, "ghcr.io/hookwright/standin:v1")
	_, _, err := e.RunKubectl(ctx, []byte(manifest), "apply", "-f", "-")
	return err
}

// waitWorkload waits until exactly n pods of the workload run (none
// pending, none failed) and returns their names.
func (e *Env) waitWorkload(ctx context.Context, n int) ([]string, error) {
	var names []string
	err := cluster.WaitFor(ctx, 2*time.Minute, fmt.Sprintf("%d pods of %s running", n, usageWorkload), func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := e.Cluster.Client.List(ctx, &pods, client.InNamespace(usageNamespace), client.MatchingLabels{"app": usageWorkload}); err != nil {
			return false, err
		}
		names = names[:0]
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodFailed {
				return false, cluster.Permanent(fmt.Errorf("pod %s failed: %s %s", p.Name, p.Status.Reason, p.Status.Message))
			}
			if p.DeletionTimestamp != nil {
				return false, nil
			}
			if p.Status.Phase == corev1.PodRunning {
				names = append(names, p.Name)
			}
		}
		return len(names) == n && len(pods.Items) == n, nil
	})
	return names, err
}

func setUsage(ctx context.Context, e *Env, pods []string, cpu string) error {
	for _, p := range pods {
		if err := e.Cluster.SetPodUsage(ctx, usageNamespace, p, cpu, ""); err != nil {
			return err
		}
	}
	return nil
}

// waitTarget polls usageNode's target annotation and allocatable cpu.
func waitTarget(ctx context.Context, e *Env, what string, d time.Duration, ok func(*v1alpha1.OversellTarget, string) bool) error {
	var last string
	err := cluster.WaitFor(ctx, d, usageNode+" "+what, func(ctx context.Context) (bool, error) {
		n := &corev1.Node{}
		if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Name: usageNode}, n); err != nil {
			return false, err
		}
		s := n.Annotations[v1alpha1.OversellTargetKey]
		last = fmt.Sprintf("allocatable cpu %s, target %s", n.Status.Allocatable.Cpu(), s)
		t := &v1alpha1.OversellTarget{}
		if json.Unmarshal([]byte(s), t) != nil || t.By != usageOversell || t.CPU == nil {
			return false, nil
		}
		return ok(t, n.Status.Allocatable.Cpu().String()), nil
	})
	if err != nil {
		return fmt.Errorf("%w; last: %s", err, last)
	}
	return nil
}

// hasOurTaint reports whether usageNode carries our taint with value
// ("" for any value).
func hasOurTaint(ctx context.Context, e *Env, value string) bool {
	n := &corev1.Node{}
	if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Name: usageNode}, n); err != nil {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == v1alpha1.OversellTaintKey && (value == "" || t.Value == value) {
			return true
		}
	}
	return false
}

func warningWith(stderr, contains string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, contains) {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(stderr)
}

func conditionMessage(no *v1alpha1.NodeOversell, typ string) string {
	for _, c := range no.Status.Conditions {
		if c.Type == typ {
			return c.Message
		}
	}
	return ""
}

// bindNodeTaints applies config/node-taints (kubectl apply -k) and binds
// it to the ServiceAccount of the running operator, wherever it was
// installed from (the pod running the operator image's manager).
func (e *Env) bindNodeTaints(ctx context.Context, r *Result) error {
	sa, err := e.applyOptIn(ctx, "node-taints")
	if err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "create", "clusterrolebinding", usageBinding, "--clusterrole=hookwright-node-taints", "--serviceaccount="+sa); err != nil {
		return err
	}
	r.check("kubectl apply -k config/node-taints; ClusterRole hookwright-node-taints bound to the operator's ServiceAccount %s", sa)
	return nil
}

// cleanUsage removes what scenario 9 made: the NodeOversell (its node
// back to the sample's ratio), the workload, the binding and the role.
func (e *Env) cleanUsage(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c := e.Cluster.Client
	_ = c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: usageNamespace}})
	_ = c.Delete(ctx, &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: usageOversell}})
	_ = cluster.WaitFor(ctx, 3*time.Minute, "NodeOversell "+usageOversell+" and namespace "+usageNamespace+" gone", func(ctx context.Context) (bool, error) {
		err1 := c.Get(ctx, client.ObjectKey{Name: usageOversell}, &v1alpha1.NodeOversell{})
		err2 := c.Get(ctx, client.ObjectKey{Name: usageNamespace}, &corev1.Namespace{})
		return apierrors.IsNotFound(err1) && apierrors.IsNotFound(err2), nil
	})
	_, _, _ = e.RunKubectl(ctx, nil, "delete", "clusterrolebinding", usageBinding, "--ignore-not-found")
	_, _, _ = e.RunKubectl(ctx, nil, "delete", "clusterrole", "hookwright-node-taints", "--ignore-not-found")
	// The node's taint is the operator's to remove; one left by a failed
	// run goes here, as an admin would remove it.
	n := &corev1.Node{}
	if c.Get(ctx, client.ObjectKey{Name: usageNode}, n) == nil {
		for _, t := range n.Spec.Taints {
			if t.Key == v1alpha1.OversellTaintKey {
				_, _, _ = e.RunKubectl(ctx, nil, "taint", "node", usageNode, v1alpha1.OversellTaintKey+"-")
			}
		}
	}
}
