// Package scenarios is hookwright's end-to-end story (issue #7), shared by
// the test suite (test/e2e, run by `make test`) and the demo
// (hack/localcluster, run by `make demo`): one implementation, each scenario
// a function returning what it checked and the timings it measured.
//
// Start brings up the local control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok), installs the CRDs, runs
// `hookwright manager` as a local process with its own ServiceAccount and
// config/rbac, lets a cluster.PodRunner run the webhook server pods the
// operator's Deployments create, and applies config/samples. Nothing in the
// operator or the servers knows they are not in a real cluster.
package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

const (
	// OperatorNamespace is the operator's namespace (config/default).
	OperatorNamespace = "hookwright-system"
	// ServerImage is the image the operator puts in the server Deployments
	// (--server-image); the pod runner maps it to the local binary.
	ServerImage = "ghcr.io/hookwright/hookwright:v0.1.0"
	// ServerEntrypoint is the image's ENTRYPOINT (Dockerfile).
	ServerEntrypoint = "/hookwright"
	// PoolLabel is on the oversold nodes; the sample NodeOversell selects it.
	PoolLabel = "pool"
	// PoolTaint keeps pods without its toleration (the webhook servers) off
	// the oversold nodes, as a dedicated node pool is usually set up, so the
	// pool's 4 CPU hold exactly four 1-CPU pods.
	PoolTaint = "hookwright.io/oversell-pool"
	// SystemNode is the node the webhook servers run on; not kwok's: the
	// pod runner is its kubelet (cluster.PodRunner.KubeletNode), so the
	// servers' pods are Ready only once they serve.
	SystemNode = "system-0"

	injectorSample = "admission_v1alpha1_sidecarinjector.yaml"
	oversellSample = "admission_v1alpha1_nodeoversell.yaml"
)

// PoolNodes are the oversold nodes.
var PoolNodes = []string{"kwok-node-0", "kwok-node-1", "kwok-node-2"}

// Nodes are the kwok nodes: the three pool=oversell nodes (4 CPU / 8Gi
// allocatable, tainted PoolTaint=true:NoSchedule). SystemNode is added by
// Start.
func Nodes() []cluster.NodeSpec {
	var out []cluster.NodeSpec
	for _, n := range PoolNodes {
		out = append(out, cluster.NodeSpec{
			Name: n, CPU: "4", Memory: "8Gi", Labels: map[string]string{PoolLabel: "oversell"},
			Taints: []corev1.Taint{{Key: PoolTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		})
	}
	return out
}

// Options configure Start.
type Options struct {
	// Dir holds everything (kubeconfig, logs, pods); "" is a temp dir
	// removed by Stop.
	Dir string
	// Binary is the hookwright executable run as the operator and, by the
	// pod runner, as the webhook servers.
	Binary string
	// Logf receives progress lines.
	Logf func(format string, args ...any)
}

// Env is the running stack.
type Env struct {
	Cluster  *cluster.Cluster
	Runner   *cluster.PodRunner
	Operator *cluster.Process
	// CADir is the operator's --ca-dir.
	CADir string
	// Kubectl is bin/k8s/kubectl.
	Kubectl string
	// OperatorArgs are the operator's command line.
	OperatorArgs []string
	// ValidationTarget is the egress target (ClusterIP:443) of the Service
	// in front of the operator's validating webhook.
	ValidationTarget string
	Logf             func(format string, args ...any)

	systemNode *cluster.Heartbeater
	olm        *olm.OLM
}

// Start brings the stack up; Stop ends it. The NodeOversell sample is
// applied with cpu ratio "1" (scenario 2 starts from no oversell).
func Start(ctx context.Context, o Options) (e *Env, err error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	e = &Env{Logf: o.Logf}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	t0 := time.Now()
	if e.Cluster, err = cluster.New(ctx, cluster.Options{
		Dir: o.Dir, ControllerManager: true, Scheduler: true, Nodes: Nodes(), Logf: o.Logf,
	}); err != nil {
		return e, err
	}
	c := e.Cluster
	e.Kubectl = filepath.Join(c.Bin, "k8s", "kubectl")
	o.Logf("stack: control plane and %d kwok nodes ready in %s", len(Nodes()), time.Since(t0).Round(time.Millisecond))

	if _, err = c.CreateNamespace(ctx, OperatorNamespace, map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
	}); err != nil {
		return e, err
	}
	kubeconfig, err := operatorKubeconfig(ctx, c)
	if err != nil {
		return e, err
	}

	e.Runner = c.NewPodRunner(cluster.PodRunnerOptions{
		Images: map[string]cluster.RunnerImage{ServerImage: {Binary: o.Binary, Entrypoint: ServerEntrypoint}},
		Logf:   o.Logf,
	})
	if e.systemNode, err = e.Runner.KubeletNode(ctx, SystemNode, map[string]string{PoolLabel: "system"}, "4", "8Gi"); err != nil {
		return e, err
	}
	if err = e.Runner.Start(ctx); err != nil {
		return e, err
	}

	e.CADir = filepath.Join(c.Dir, "operator", "ca")
	if err = os.MkdirAll(e.CADir, 0o755); err != nil {
		return e, err
	}
	probe, err := cluster.FreePort()
	if err != nil {
		return e, err
	}
	metrics, err := cluster.FreePort()
	if err != nil {
		return e, err
	}
	webhookPort, err := cluster.FreePort()
	if err != nil {
		return e, err
	}
	// config/webhook's Service in front of the manager's validating webhook:
	// the egress proxy takes its ClusterIP:443 to the local process.
	webhookSvc := &corev1.Service{}
	if err = loadManifest(filepath.Join("config", "webhook", "service.yaml"), webhookSvc); err != nil {
		return e, err
	}
	if err = c.Client.Create(ctx, webhookSvc); err != nil {
		return e, err
	}
	if err = c.RouteService(webhookSvc, fmt.Sprintf("127.0.0.1:%d", webhookPort)); err != nil {
		return e, err
	}
	// config/manager/manager.yaml's args, with local listen addresses, plus
	// what its env and volumes give in-cluster.
	e.OperatorArgs = []string{
		"manager",
		"--leader-elect",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics),
		"--ca-dir=" + e.CADir,
		fmt.Sprintf("--webhook-port=%d", webhookPort),
		"--webhook-service=" + webhookSvc.Name,
		"--namespace=" + OperatorNamespace,
		"--server-image=" + ServerImage,
	}
	if e.Operator, err = cluster.StartProcess("operator", filepath.Join(c.Dir, "logs"), o.Binary, e.OperatorArgs,
		[]string{"KUBECONFIG=" + kubeconfig}); err != nil {
		return e, err
	}
	if err = cluster.WaitFor(ctx, 60*time.Second, "operator /readyz", func(ctx context.Context) (bool, error) {
		if done, perr := e.Operator.Exited(); done {
			return false, cluster.Permanent(fmt.Errorf("operator exited (%v); log tail:\n%s", perr, e.Operator.Tail(3000)))
		}
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", probe))
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, nil
	}); err != nil {
		return e, err
	}
	o.Logf("stack: operator running (log %s)", e.Operator.Log)

	si := &v1alpha1.SidecarInjector{}
	if err = cluster.LoadSample(injectorSample, si); err != nil {
		return e, err
	}
	target := webhookSvc.Spec.ClusterIP + ":443"
	e.ValidationTarget = target
	if err = createValidated(ctx, c, si); err != nil {
		return e, fmt.Errorf("apply %s: %w", injectorSample, err)
	}
	no := &v1alpha1.NodeOversell{}
	if err = cluster.LoadSample(oversellSample, no); err != nil {
		return e, err
	}
	no.Spec.Ratios.CPU = "1"
	if err = createValidated(ctx, c, no); err != nil {
		return e, fmt.Errorf("apply %s: %w", oversellSample, err)
	}
	o.Logf("stack: applied config/samples (NodeOversell %s with cpu ratio 1); egress connections to the operator's validating webhook (Service %s): %d",
		no.Name, webhookSvc.Name, c.Egress.Hits(target))
	if err = e.WaitReady(ctx, 3*time.Minute); err != nil {
		return e, err
	}
	o.Logf("stack: both webhooks ready, %s after start; egress connections to the operator's validating webhook: %d",
		time.Since(t0).Round(time.Millisecond), c.Egress.Hits(target))
	var pods corev1.PodList
	if err = c.Client.List(ctx, &pods, client.InNamespace(OperatorNamespace)); err != nil {
		return e, err
	}
	for _, p := range pods.Items {
		ready := false
		for _, cond := range p.Status.Conditions {
			ready = ready || cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue
		}
		o.Logf("stack: server pod %s on %s, Ready=%t, pod IP %s", p.Name, p.Spec.NodeName, ready, p.Status.PodIP)
	}
	return e, nil
}

// WaitReady waits until every SidecarInjector and NodeOversell is Ready
// and the pod runner routes each one's Service.
func (e *Env) WaitReady(ctx context.Context, timeout time.Duration) error {
	var why string
	err := cluster.WaitFor(ctx, timeout, "SidecarInjector and NodeOversell Ready, Services routed", func(ctx context.Context) (bool, error) {
		if e.Operator != nil {
			if done, perr := e.Operator.Exited(); done {
				return false, cluster.Permanent(fmt.Errorf("operator exited (%v); log tail:\n%s", perr, e.Operator.Tail(3000)))
			}
		}
		var sis v1alpha1.SidecarInjectorList
		var nos v1alpha1.NodeOversellList
		if err := e.Cluster.Client.List(ctx, &sis); err != nil {
			return false, err
		}
		if err := e.Cluster.Client.List(ctx, &nos); err != nil {
			return false, err
		}
		type cr struct {
			kind  desired.Kind
			obj   client.Object
			conds []metav1.Condition
		}
		var crs []cr
		for i := range sis.Items {
			crs = append(crs, cr{desired.SidecarKind, &sis.Items[i], sis.Items[i].Status.Conditions})
		}
		for i := range nos.Items {
			crs = append(crs, cr{desired.OversellKind, &nos.Items[i], nos.Items[i].Status.Conditions})
		}
		routes := e.Runner.Routes()
		for _, x := range crs {
			c := apimeta.FindStatusCondition(x.conds, v1alpha1.ConditionReady)
			if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != x.obj.GetGeneration() {
				why = fmt.Sprintf("%s Ready: %+v", x.obj.GetName(), c)
				return false, nil
			}
			svc := &corev1.Service{}
			if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: x.kind.BaseName(x.obj.GetName())}, svc); err != nil {
				return false, err
			}
			if _, ok := routes[svc.Spec.ClusterIP+":443"]; !ok {
				why = "service " + svc.Name + " not routed yet"
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, why)
	}
	return nil
}

// Stop ends the pod runner's processes, the operator and the cluster.
func (e *Env) Stop() {
	if e.olm != nil {
		e.olm.Stop()
	}
	if e.Runner != nil {
		e.Runner.Stop()
	}
	if e.Operator != nil {
		_ = e.Operator.Stop(10 * time.Second)
	}
	if e.systemNode != nil {
		e.systemNode.Stop()
	}
	if e.Cluster != nil {
		_ = e.Cluster.Stop()
	}
}

// Kubectl runs bin/k8s/kubectl with the admin kubeconfig; stdin may be nil.
func (e *Env) RunKubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, e.Kubectl, append([]string{"--kubeconfig=" + e.Cluster.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), errb.String(), err
}

// createValidated creates obj, retrying while the operator's validating
// webhook (failurePolicy Fail) is not serving yet: the operator writes its
// ValidatingWebhookConfiguration as it starts, before its certificate may
// be loaded.
func createValidated(ctx context.Context, c *cluster.Cluster, obj client.Object) error {
	return cluster.WaitFor(ctx, 60*time.Second, "create "+obj.GetName(), func(ctx context.Context) (bool, error) {
		err := c.Client.Create(ctx, obj)
		if err != nil && strings.Contains(err.Error(), "failed calling webhook") {
			return false, err
		}
		if err != nil {
			return false, cluster.Permanent(err)
		}
		return true, nil
	})
}

// loadManifest reads a one-object manifest of config/ and applies what
// config/default's kustomization does to it: namespace hookwright-system,
// name prefix hookwright-.
func loadManifest(rel string, obj client.Object) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, obj); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	obj.SetName("hookwright-" + obj.GetName())
	if obj.GetNamespace() != "" {
		obj.SetNamespace(OperatorNamespace)
	}
	return nil
}

// operatorKubeconfig applies config/rbac as config/default would
// (namespace hookwright-system, name prefix hookwright-) and writes a
// kubeconfig with a token of the operator's ServiceAccount, so the
// operator runs with exactly the RBAC it ships.
func operatorKubeconfig(ctx context.Context, c *cluster.Cluster) (string, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	const prefix = "hookwright-"
	for _, f := range []string{"service_account.yaml", "role.yaml", "role_binding.yaml", "leader_election_role.yaml", "leader_election_role_binding.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, "config", "rbac", f))
		if err != nil {
			return "", err
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				return "", fmt.Errorf("config/rbac/%s: %w", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			u.SetName(prefix + u.GetName())
			if u.GetNamespace() != "" {
				u.SetNamespace(OperatorNamespace)
			}
			if ref, ok, _ := unstructured.NestedString(u.Object, "roleRef", "name"); ok {
				_ = unstructured.SetNestedField(u.Object, prefix+ref, "roleRef", "name")
			}
			if subs, ok, _ := unstructured.NestedSlice(u.Object, "subjects"); ok {
				for _, s := range subs {
					m := s.(map[string]any)
					m["name"] = prefix + m["name"].(string)
					m["namespace"] = OperatorNamespace
				}
				_ = unstructured.SetNestedSlice(u.Object, subs, "subjects")
			}
			if err := c.Client.Create(ctx, u); err != nil {
				return "", fmt.Errorf("config/rbac/%s %s: %w", f, u.GetName(), err)
			}
		}
	}
	tr, err := c.Clientset.CoreV1().ServiceAccounts(OperatorNamespace).CreateToken(ctx, prefix+"controller-manager",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(7 * 24 * 3600))}},
		metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	dir := filepath.Join(c.Dir, "operator")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	kc.AuthInfos["operator"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["operator"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "operator", Namespace: OperatorNamespace}
	kc.CurrentContext = "operator"
	path := filepath.Join(dir, "kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}
