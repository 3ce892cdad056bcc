package scenarios

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	// LabNamespace is labelled for injection (the sample's namespaceSelector).
	LabNamespace = "lab"
	// PlainNamespace has no injection label.
	PlainNamespace   = "plain"
	statusAnnotation = "sidecar.hookwright.io/status"
	nginx            = "nginx:1.23-alpine"
)

// sidecarCounts counts the sample's containers in a pod: the init container
// proxy-init and the proxy sidecar (a native sidecar in initContainers, or
// a regular container).
func sidecarCounts(p *corev1.Pod) (proxyInit, proxy int) {
	for _, c := range p.Spec.InitContainers {
		switch c.Name {
		case "proxy-init":
			proxyInit++
		case "proxy":
			proxy++
		}
	}
	for _, c := range p.Spec.Containers {
		if c.Name == "proxy" {
			proxy++
		}
	}
	return
}

func injectedOnce(p *corev1.Pod) error {
	pi, px := sidecarCounts(p)
	if pi != 1 || px != 1 || p.Annotations[statusAnnotation] == "" {
		return fmt.Errorf("pod %s/%s: proxy-init ×%d, proxy ×%d, %s=%q; want each once and the annotation",
			p.Namespace, p.Name, pi, px, statusAnnotation, p.Annotations[statusAnnotation])
	}
	return nil
}

func untouched(p *corev1.Pod) error {
	pi, px := sidecarCounts(p)
	if pi != 0 || px != 0 || p.Annotations[statusAnnotation] != "" {
		return fmt.Errorf("pod %s/%s was injected (proxy-init ×%d, proxy ×%d, annotation %q)", p.Namespace, p.Name, pi, px, p.Annotations[statusAnnotation])
	}
	return nil
}

// Injection is scenario 1: the sample SidecarInjector injects a
// Deployment's pods in a labelled namespace exactly once, leaves an
// unlabelled namespace, an opted-out pod and a hostNetwork pod (with a
// warning) alone, and a server-side dry run shows the injected pod and
// stores nothing. Every step is the kubectl command a user would type.
func Injection(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster.Client
	if _, _, err := e.RunKubectl(ctx, nil, "create", "namespace", LabNamespace); err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "label", "namespace", LabNamespace, "sidecar-injection=enabled"); err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "create", "namespace", PlainNamespace); err != nil {
		return err
	}
	start := time.Now()
	if _, _, err := e.RunKubectl(ctx, nil, "create", "deployment", "test", "--image="+nginx, "--replicas=2", "--port=80", "-n", LabNamespace); err != nil {
		return err
	}
	var pods corev1.PodList
	if err := cluster.WaitFor(ctx, 60*time.Second, "2 pods of deployment test", func(ctx context.Context) (bool, error) {
		err := c.List(ctx, &pods, client.InNamespace(LabNamespace), client.MatchingLabels{"app": "test"})
		return err == nil && len(pods.Items) == 2, err
	}); err != nil {
		return err
	}
	for i := range pods.Items {
		if err := injectedOnce(&pods.Items[i]); err != nil {
			return err
		}
	}
	r.timing("kubectl create deployment → both pods created", time.Since(start), 0)
	r.check("kubectl create deployment test --replicas=2 -n lab: both pods carry proxy-init and proxy exactly once (%s)",
		sidecarPlacement(&pods.Items[0]))
	if err := labRuns(ctx, e, r, start); err != nil {
		return err
	}

	if _, _, err := e.RunKubectl(ctx, nil, "run", "plain", "--image="+nginx, "-n", PlainNamespace); err != nil {
		return err
	}
	p := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: PlainNamespace, Name: "plain"}, p); err != nil {
		return err
	}
	if err := untouched(p); err != nil {
		return err
	}
	r.check("a pod in the unlabelled namespace %q is untouched", PlainNamespace)

	if _, _, err := e.RunKubectl(ctx, nil, "run", "optout", "--image="+nginx, "-n", LabNamespace, "--labels=sidecar.hookwright.io/inject=false"); err != nil {
		return err
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: LabNamespace, Name: "optout"}, p); err != nil {
		return err
	}
	if err := untouched(p); err != nil {
		return err
	}
	r.check("a pod labelled sidecar.hookwright.io/inject=false is untouched")

	hostNet := podManifest("hostnet", func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	_, stderr, err := e.RunKubectl(ctx, hostNet, "create", "-n", LabNamespace, "-f", "-")
	if err != nil {
		return err
	}
	warning := firstWarning(stderr)
	if warning == "" {
		return fmt.Errorf("kubectl create of a hostNetwork pod printed no warning; stderr: %q", stderr)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: LabNamespace, Name: "hostnet"}, p); err != nil {
		return err
	}
	if err := untouched(p); err != nil {
		return err
	}
	r.check("a hostNetwork pod is skipped; kubectl shows %q", warning)

	out, _, err := e.RunKubectl(ctx, podManifest("dryrun", nil), "create", "--dry-run=server", "-o", "yaml", "-n", LabNamespace, "-f", "-")
	if err != nil {
		return err
	}
	dry := &corev1.Pod{}
	if err := yaml.Unmarshal([]byte(out), dry); err != nil {
		return fmt.Errorf("kubectl create --dry-run=server output: %w", err)
	}
	if err := injectedOnce(dry); err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: LabNamespace, Name: "dryrun"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("dry-run pod: get returned %v, want NotFound", err)
	}
	r.check("kubectl create --dry-run=server shows the injected pod and stores nothing")
	return nil
}

// labRuns is what a platform engineer checks first (issue 10 item 6): the
// injected pods of deployment test run on the real node, nginx and the
// proxy native sidecar ready, proxy-init completed; `kubectl create service
// clusterip test --tcp=80:80` then takes a request from another pod to each
// of them through kube-proxy.
func labRuns(ctx context.Context, e *Env, r *Result, created time.Time) error {
	c := e.Cluster.Client
	var pods corev1.PodList
	var why string
	if err := cluster.WaitFor(ctx, 3*time.Minute, "both pods of deployment test Running, every container ready", func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, &pods, client.InNamespace(LabNamespace), client.MatchingLabels{"app": "test"}); err != nil {
			return false, err
		}
		if len(pods.Items) != 2 {
			why = fmt.Sprintf("%d pods", len(pods.Items))
			return false, nil
		}
		for i := range pods.Items {
			if err := labPodReady(&pods.Items[i]); err != nil {
				why = err.Error()
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("%w (%s)", err, why)
	}
	r.timing("kubectl create deployment → both pods Running on "+SystemNode+", nginx and proxy ready, proxy-init exit 0", time.Since(created), 0)
	r.check("both pods Running in real containers on %s (%s, %s): nginx ready, proxy (native sidecar) ready, proxy-init completed with exit 0",
		SystemNode, pods.Items[0].Status.PodIP, pods.Items[1].Status.PodIP)

	if _, _, err := e.RunKubectl(ctx, nil, "create", "service", "clusterip", "test", "--tcp=80:80", "-n", LabNamespace); err != nil {
		return err
	}
	svc := &corev1.Service{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: LabNamespace, Name: "test"}, svc); err != nil {
		return err
	}
	// Pods have no resolver here (no cluster DNS runs): the client dials
	// the ClusterIP. One client per nginx pod, each waiting for its
	// hostname in the answer, so both endpoints are shown to be reached.
	url := "http://" + svc.Spec.ClusterIP + "/"
	start := time.Now()
	for i, p := range pods.Items {
		name := fmt.Sprintf("lab-client-%d", i)
		if _, _, err := e.RunKubectl(ctx, nil, "run", name, "-n", PlainNamespace, "--image="+ociimage.StandinName,
			"--restart=Never", "--", "get", "--tries=300", "--interval=100ms", url, "stand-in nginx on "+p.Name); err != nil {
			return err
		}
	}
	for i := range pods.Items {
		name := fmt.Sprintf("lab-client-%d", i)
		cp := &corev1.Pod{}
		if err := cluster.WaitFor(ctx, 2*time.Minute, "pod "+name+" finished", func(ctx context.Context) (bool, error) {
			if err := c.Get(ctx, client.ObjectKey{Namespace: PlainNamespace, Name: name}, cp); err != nil {
				return false, err
			}
			return cp.Status.Phase == corev1.PodSucceeded || cp.Status.Phase == corev1.PodFailed, nil
		}); err != nil {
			return err
		}
		logs, _, err := e.RunKubectl(ctx, nil, "logs", "-n", PlainNamespace, name)
		if err != nil {
			return err
		}
		if cp.Status.Phase != corev1.PodSucceeded || !strings.Contains(logs, pods.Items[i].Name) {
			return fmt.Errorf("client %s %s; kubectl logs: %q", name, cp.Status.Phase, logs)
		}
	}
	r.timing("kubectl create service clusterip test → a pod's request reached each nginx pod", time.Since(start), 0)
	r.check("kubectl create service clusterip test --tcp=80:80 -n lab: pods in %q reached both nginx pods through %s (kube-proxy); kubectl logs shows their answers",
		PlainNamespace, url)
	return nil
}

// labPodReady says why p is not Running with every container ready and its
// init container proxy-init completed.
func labPodReady(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("pod %s %s", p.Name, p.Status.Phase)
	}
	for _, s := range p.Status.InitContainerStatuses {
		switch s.Name {
		case "proxy-init":
			if t := s.State.Terminated; t == nil || t.ExitCode != 0 {
				return fmt.Errorf("pod %s: proxy-init %+v", p.Name, s.State)
			}
		case "proxy":
			if !s.Ready || s.State.Running == nil {
				return fmt.Errorf("pod %s: proxy sidecar not ready: %+v", p.Name, s.State)
			}
		}
	}
	for _, s := range p.Status.ContainerStatuses {
		if !s.Ready {
			return fmt.Errorf("pod %s: container %s not ready: %+v", p.Name, s.Name, s.State)
		}
	}
	if !cluster.PodReady(p) {
		return fmt.Errorf("pod %s not Ready", p.Name)
	}
	return nil
}

func sidecarPlacement(p *corev1.Pod) string {
	for _, c := range p.Spec.InitContainers {
		if c.Name == "proxy" && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return "proxy as a native sidecar"
		}
	}
	return "proxy as a container"
}

// firstWarning returns the first "Warning: ..." line kubectl printed.
func firstWarning(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "Warning: ") {
			return l
		}
	}
	return ""
}

// podManifest is a plain nginx pod as YAML, changed by mutate.
func podManifest(name string, mutate func(*corev1.Pod)) []byte {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: nginx}}},
	}
	if mutate != nil {
		mutate(p)
	}
	b, err := yaml.Marshal(p)
	if err != nil {
		panic(err) // a Pod always marshals
	}
	return b
}

// dryRunPod creates a pod in the lab namespace with a server-side dry run
// and returns what the API server would store.
func dryRunPod(ctx context.Context, e *Env, name string) (*corev1.Pod, error) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: LabNamespace, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: nginx}}},
	}
	if err := e.Cluster.Client.Create(ctx, p, client.DryRunAll); err != nil {
		return nil, err
	}
	return p, nil
}
