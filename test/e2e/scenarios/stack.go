// Package scenarios is hookwright's end-to-end story (issue #7), shared by
// the test suites (test/e2e and test/e2e/standalone, run side by side by
// `make test`: TestMain, RunInOrder) and the demo
// (hack/localcluster, run by `make demo`): one implementation, each scenario
// a function returning what it checked and the timings it measured.
//
// Start brings up the local control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok for the oversold pool),
// builds the images without Docker (hack/ociimage) into a registry on
// 127.0.0.1, starts SystemNode as a real node (kubelet, containerd, runc,
// CNI, kube-proxy), deploys the operator as `make deploy` does
// (config/default, its image pulled from that registry) and applies
// config/samples. The operator, its webhook servers and every workload of
// the scenarios run in real containers on SystemNode; nothing in them knows
// they are not in any other cluster.
//
// It must not import webhooks: the servers are reached through the API
// server (controllers is imported for its exported names only).
package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/demoenv"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

const (
	// OperatorNamespace is the operator's namespace (config/default).
	OperatorNamespace = "hookwright-system"
	// OperatorDeployment is config/default's operator Deployment.
	OperatorDeployment = "hookwright-controller-manager"
	// ServerImage is the operator image: config/manager's image, which the
	// operator also puts in the server Deployments (RELATED_IMAGE_SERVER).
	ServerImage = ociimage.OperatorName
	// PoolLabel is on the oversold nodes; the sample NodeOversell selects it.
	PoolLabel = "pool"
	// PoolTaint keeps pods without its toleration (the webhook servers) off
	// the oversold nodes, as a dedicated node pool is usually set up, so the
	// pool's 4 CPU hold exactly four 1-CPU pods.
	PoolTaint = "hookwright.io/oversell-pool"
	// SystemNode is the real node: the operator, the webhook servers and
	// the scenarios' workloads run there.
	SystemNode = "system-0"
	// fieldOwner applies config/default (server-side apply).
	fieldOwner = "hookwright-demo"

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
	// Dir holds everything (kubeconfig, logs, the node's state); "" is a
	// temp dir removed by Stop.
	Dir string
	// Logf receives progress lines.
	Logf func(format string, args ...any)
}

// Env is the running stack.
type Env struct {
	Cluster *cluster.Cluster
	// Node is SystemNode.
	Node *cluster.RealNode
	// Registry serves the images on 127.0.0.1 (the node's only registry),
	// over HTTP (Addr) and HTTPS (TLSAddr).
	Registry *ociimage.Registry
	// RegistryFiles are the HTTPS listener's CA and trust store.
	RegistryFiles ociimage.TLSFiles
	// EnvFile is Dir/env (hack/demoenv): `. EnvFile` sets up a shell.
	EnvFile string
	// Kubectl is bin/k8s/kubectl.
	Kubectl string
	// ValidationTarget is the egress target (ClusterIP:443) of the Service
	// in front of the operator's validating webhook.
	ValidationTarget string
	// Figures are what Start measured, one line each.
	Figures []string
	Logf    func(format string, args ...any)

	// deployed are config/default's objects as applied (for scenario 5,
	// which replaces them with OLM's).
	deployed []*unstructured.Unstructured
	olm      *olm.OLM
	// olmInstall is scenario 5's catalog install (scenario 7 removes it).
	olmInstall *olm.Installation
	// readme is scenario 7's run of the README block, for READMEOLM.
	readme *readmeRun
	// allKinds is client()'s client.
	clientOnce sync.Once
	allKinds   client.Client
	clientErr  error
}

func (e *Env) figure(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	e.Figures = append(e.Figures, line)
	e.Logf("stack: figure: %s", line)
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
	root, err := cluster.RepoRoot()
	if err != nil {
		return e, err
	}
	// A missing prerequisite fails here, naming it.
	if err = cluster.RealNodePrerequisites(filepath.Join(root, "bin")); err != nil {
		return e, err
	}
	t0 := time.Now()
	if e.Cluster, err = cluster.New(ctx, cluster.Options{
		Dir: o.Dir, ControllerManager: true, Scheduler: true, Nodes: Nodes(), ServiceAccountTokens: true, Logf: o.Logf,
		// metrics.k8s.io for scenario 9's usage-aware NodeOversell.
		MetricsServer: true,
	}); err != nil {
		return e, err
	}
	c := e.Cluster
	e.Kubectl = filepath.Join(c.Bin, "k8s", "kubectl")
	o.Logf("stack: control plane and %d kwok nodes ready in %s", len(Nodes()), time.Since(t0).Round(time.Millisecond))

	start := time.Now()
	reg, imgs, err := ociimage.Serve(ctx, ociimage.Options{Root: root, BinDir: filepath.Join(c.Dir, "images")},
		ociimage.SetOperator, ociimage.SetPause, ociimage.SetStandins)
	if err != nil {
		return e, err
	}
	e.Registry = reg
	e.figure("%d images (operator, pause, stand-ins) built without Docker and pushed to the registry on %s in %s",
		len(imgs), reg.Addr, time.Since(start).Round(time.Millisecond))
	if err = e.startRegistryTLS(root); err != nil {
		return e, err
	}
	if e.Node, err = c.StartRealNode(ctx, cluster.RealNodeSpec{
		Name: SystemNode, Labels: map[string]string{PoolLabel: "system"}, Registry: reg.Addr,
		RegistryTLS: reg.TLSAddr, RegistryCA: e.RegistryFiles.CA,
		// A rotated serving certificate reaches the pods' mounted Secret
		// on the kubelet's next pod sync: 10 s instead of 1 min + jitter.
		Kubelet: cluster.KubeletOptions{SyncFrequency: 10 * time.Second},
	}); err != nil {
		return e, err
	}
	e.figure("real node %s (kubelet, containerd, runc, CNI bridge %s): start → Ready %s",
		SystemNode, e.Node.PodSubnet, e.Node.StartedToReady.Round(time.Millisecond))

	start = time.Now()
	if err = e.deployOperator(ctx, root); err != nil {
		return e, err
	}
	e.figure("operator deployed as config/default (%s, 2 replicas pulled from the registry): applied → available %s",
		ServerImage, time.Since(start).Round(time.Millisecond))

	webhookSvc := &corev1.Service{}
	if err = c.Client.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: desired.DefaultWebhookService}, webhookSvc); err != nil {
		return e, err
	}
	target := webhookSvc.Spec.ClusterIP + ":443"
	e.ValidationTarget = target
	si := &v1alpha1.SidecarInjector{}
	if err = cluster.LoadSample(injectorSample, si); err != nil {
		return e, err
	}
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
		o.Logf("stack: pod %s on %s, Ready=%t, pod IP %s", p.Name, p.Spec.NodeName, cluster.PodReady(&p), p.Status.PodIP)
		if sched, ready, ok := scheduledToReady(&p); ok && !strings.HasPrefix(p.Name, OperatorDeployment) {
			e.figure("webhook server pod %s: scheduled → Ready %s (condition times, 1 s resolution; image pull, start, readiness probe)",
				p.Name, ready.Sub(sched))
		}
	}
	return e, nil
}

// startRegistryTLS starts the registry's HTTPS listener (operator-sdk
// reads images over HTTPS only), writes its CA and a trust store under
// Dir/registry and the env file a user's shell sources (KUBECONFIG,
// SSL_CERT_FILE, IMAGE_REGISTRY: the HTTPS address, and bin/ on PATH),
// from which the run-bundle targets take their defaults
// (DEMO_DIR=Dir).
func (e *Env) startRegistryTLS(root string) error {
	c := e.Cluster
	if err := e.Registry.StartTLS(); err != nil {
		return err
	}
	// The trust store starts with the CAs the user's shell trusts.
	system := os.Getenv("SSL_CERT_FILE")
	if system == "" {
		system = ociimage.DefaultCACertificates
	}
	files, err := e.Registry.WriteTLSFiles(filepath.Join(c.Dir, "registry"), system)
	if err != nil {
		return err
	}
	e.RegistryFiles = files
	env, err := demoenv.Render(map[string]string{
		demoenv.Kubeconfig: c.Kubeconfig, demoenv.SSLCertFile: files.Trust, demoenv.ImageRegistry: e.Registry.TLSAddr,
	}, filepath.Join(root, "bin"), filepath.Join(root, "bin", "k8s"))
	if err != nil {
		return err
	}
	e.EnvFile = filepath.Join(c.Dir, demoenv.FileName)
	if err := os.WriteFile(e.EnvFile, env, 0o644); err != nil {
		return err
	}
	e.figure("registry also serves HTTPS on %s (its CA %s, trusted by %s's containerd); a shell's setup: . %s",
		e.Registry.TLSAddr, files.CA, SystemNode, e.EnvFile)
	return nil
}

// scheduledToReady are the times of p's PodScheduled and Ready conditions.
func scheduledToReady(p *corev1.Pod) (scheduled, ready time.Time, ok bool) {
	for _, c := range p.Status.Conditions {
		switch {
		case c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue:
			scheduled = c.LastTransitionTime.Time
		case c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue:
			ready = c.LastTransitionTime.Time
		}
	}
	return scheduled, ready, !scheduled.IsZero() && !ready.IsZero()
}

// deployOperator applies `kustomize build config/default` (what `make
// deploy` applies; config/manager's image is ServerImage) by server-side
// apply and waits until the operator Deployment is available.
func (e *Env) deployOperator(ctx context.Context, root string) error {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, "config", "default"))
	if err != nil {
		return fmt.Errorf("kustomize build config/default: %w", err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			return err
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	// Namespaces and CRDs first, as kubectl apply's retries would end up.
	first := func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "Namespace" || u.GetKind() == "CustomResourceDefinition"
	}
	sort.SliceStable(objs, func(i, j int) bool { return first(objs[i]) && !first(objs[j]) })
	for _, u := range objs {
		if err := e.Cluster.Client.Patch(ctx, u, client.Apply, client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		e.deployed = append(e.deployed, u)
	}
	var last string
	err = cluster.WaitFor(ctx, 3*time.Minute, "operator Deployment available", func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: OperatorDeployment}, d); err != nil {
			return false, err
		}
		last = fmt.Sprintf("%d/%d ready", d.Status.ReadyReplicas, ptr.Deref(d.Spec.Replicas, 1))
		return d.Status.ObservedGeneration == d.Generation && d.Status.ReadyReplicas == ptr.Deref(d.Spec.Replicas, 1), nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s); pods in %s:\n%s", err, last, OperatorNamespace, e.PodsLogTail(ctx))
	}
	return nil
}

// PodsLogTail is, for every pod in OperatorNamespace (the operator's and
// the webhook servers'), a status line (phase, Ready, each container's
// restarts and last termination) and the end of its log, with the end of
// the previous container's log when one restarted, read through the API
// server (pods/log) as `kubectl logs [--previous]` does.
func (e *Env) PodsLogTail(ctx context.Context) string {
	var pods corev1.PodList
	if err := e.Cluster.Client.List(ctx, &pods, client.InNamespace(OperatorNamespace)); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "--- %s on %s: %s, Ready=%v, deleting=%v\n", p.Name, p.Spec.NodeName, p.Status.Phase, cluster.PodReady(&p), p.DeletionTimestamp != nil)
		restarted := false
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "    container %s: ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil {
				restarted = true
				fmt.Fprintf(&b, ", last terminated %s (exit %d, signal %d) at %s: %s", t.Reason, t.ExitCode, t.Signal, t.FinishedAt.UTC().Format(time.RFC3339), t.Message)
			}
			b.WriteString("\n")
		}
		tail := func(previous bool) {
			out, err := e.Cluster.Clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](40), Previous: previous}).DoRaw(ctx)
			if err != nil {
				fmt.Fprintf(&b, "(logs: %v)\n", err)
				return
			}
			b.Write(out)
		}
		tail(false)
		if restarted {
			b.WriteString("    previous container's log:\n")
			tail(true)
		}
	}
	return b.String()
}

// CADirs are the operator pods' --ca-dir as the kubelet mounted it on the
// node: the Secret volume "ca" (config/manager) under the kubelet's root.
func (e *Env) CADirs(ctx context.Context) ([]string, error) {
	var pods corev1.PodList
	if err := e.Cluster.Client.List(ctx, &pods, client.InNamespace(OperatorNamespace),
		client.MatchingLabels{"app.kubernetes.io/component": "manager"}); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName == SystemNode {
			out = append(out, filepath.Join(e.Node.Dir, "kubelet", "pods", string(p.UID), "volumes", "kubernetes.io~secret", "ca"))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no operator pod on %s", SystemNode)
	}
	return out, nil
}

// WaitReady waits until every SidecarInjector and NodeOversell is Ready
// and each one's Service has a ready endpoint (what kube-proxy routes to).
func (e *Env) WaitReady(ctx context.Context, timeout time.Duration) error {
	var why string
	err := cluster.WaitFor(ctx, timeout, "SidecarInjector and NodeOversell Ready, their Services with ready endpoints", func(ctx context.Context) (bool, error) {
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
		for _, x := range crs {
			c := apimeta.FindStatusCondition(x.conds, v1alpha1.ConditionReady)
			if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != x.obj.GetGeneration() {
				why = fmt.Sprintf("%s Ready: %+v", x.obj.GetName(), c)
				return false, nil
			}
			svc := x.kind.BaseName(x.obj.GetName())
			var slices discoveryv1.EndpointSliceList
			if err := e.Cluster.Client.List(ctx, &slices, client.InNamespace(OperatorNamespace),
				client.MatchingLabels{discoveryv1.LabelServiceName: svc}); err != nil {
				return false, err
			}
			ready := false
			for _, s := range slices.Items {
				for _, ep := range s.Endpoints {
					ready = ready || ptr.Deref(ep.Conditions.Ready, false)
				}
			}
			if !ready {
				why = "service " + svc + " has no ready endpoint yet"
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

// Stop ends OLM, the cluster (the real node first: its pods are deleted
// through the API server, then everything it made is removed) and the
// registry.
// It is safe to call twice.
func (e *Env) Stop() {
	if e.olm != nil {
		e.olm.Stop()
		e.olm = nil
	}
	if e.Cluster != nil {
		_ = e.Cluster.Stop()
	}
	if e.Registry != nil {
		_ = e.Registry.Close()
		e.Registry = nil
	}
}

// RunKubectl runs bin/k8s/kubectl with the admin kubeconfig; stdin may be
// nil. A run that never reached the API server (kubectl's "Unable to
// connect to the server", e.g. its 10 s TLS handshake timeout on a starved
// machine) is run again, up to three times in all, as a user would. Such
// a run mostly sent nothing; a create that did land fails on its retry
// with AlreadyExists, as it would have failed without one.
func (e *Env) RunKubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error) {
	for attempt := 1; ; attempt++ {
		cmd := exec.CommandContext(ctx, e.Kubectl, append([]string{"--kubeconfig=" + e.Cluster.Kubeconfig}, args...)...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err = cmd.Run()
		if err != nil && attempt < 3 && ctx.Err() == nil && strings.Contains(errb.String(), "Unable to connect to the server") {
			e.Logf("kubectl %s: %s; running it again", strings.Join(args, " "), strings.TrimSpace(errb.String()))
			continue
		}
		if err != nil {
			err = fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
		}
		return out.String(), errb.String(), err
	}
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
