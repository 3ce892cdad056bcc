package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

// KwokNodeAnnotation marks the nodes kwok manages.
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

// NodeSpec is a simulated node. Quantities are Kubernetes quantity strings.
type NodeSpec struct {
	Name   string
	Labels map[string]string
	// CPU and Memory are the capacity, e.g. "4" and "8Gi". Defaults 4 / 8Gi.
	CPU, Memory string
	// AllocatableCPU and AllocatableMemory default to the capacity.
	AllocatableCPU, AllocatableMemory string
	// Pods is the pod capacity; default 110.
	Pods string
	// Taints are set on the node's spec.
	Taints []corev1.Taint
}

func (c *Cluster) startKwok(ctx context.Context) error {
	cfgPath := filepath.Join(c.Dir, "kwok.yaml")
	cfg, err := kwokConfig(c.opts.NodeHeartbeat, c.opts.MetricsServer)
	if err != nil {
		return err
	}
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return err
	}
	bin := filepath.Join(c.Bin, "kwok")
	args := append(c.kubeconfigArgs(),
		"--config="+cfgPath,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+KwokNodeAnnotation+"=fake",
		// Pod IPs are fake and never dialled.
		"--cidr=10.244.0.0/16",
		"--v=INFO",
	)
	if c.opts.MetricsServer {
		// metrics-server scrapes kwok's emulated /metrics/resource at the
		// nodes' InternalIP and kubelet port (metrics.go).
		port, err := FreePort()
		if err != nil {
			return err
		}
		c.kwokPort = port
		args = append(args, "--node-ip=127.0.0.1", fmt.Sprintf("--node-port=%d", port), fmt.Sprintf("--server-address=127.0.0.1:%d", port))
	} else {
		args = append(args, "--node-ip=10.96.0.1", "--server-address=")
	}
	if err := c.startAndWait(ctx, "kwok", bin, args, nil); err != nil {
		return err
	}
	for _, n := range c.opts.Nodes {
		if err := c.AddNode(ctx, n); err != nil {
			return err
		}
	}
	names := make([]string, len(c.opts.Nodes))
	for i, n := range c.opts.Nodes {
		names[i] = n.Name
	}
	return WaitFor(ctx, 60*time.Second, "kwok nodes "+strings.Join(names, ",")+" Ready", func(ctx context.Context) (bool, error) {
		for _, name := range names {
			ready, err := c.NodeReady(ctx, name)
			if err != nil || !ready {
				return false, err
			}
		}
		return true, nil
	})
}

// AddNode registers a node for kwok to manage (kwok must be running).
func (c *Cluster) AddNode(ctx context.Context, n NodeSpec) error {
	q := func(v, def string) resource.Quantity {
		if v == "" {
			v = def
		}
		return resource.MustParse(v)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    q(n.CPU, "4"),
		corev1.ResourceMemory: q(n.Memory, "8Gi"),
		corev1.ResourcePods:   q(n.Pods, "110"),
	}
	alloc := corev1.ResourceList{
		corev1.ResourceCPU:    q(n.AllocatableCPU, capacity.Cpu().String()),
		corev1.ResourceMemory: q(n.AllocatableMemory, capacity.Memory().String()),
		corev1.ResourcePods:   capacity[corev1.ResourcePods],
	}
	labels := map[string]string{
		"kubernetes.io/hostname": n.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		"type":                   "kwok",
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        n.Name,
			Labels:      labels,
			Annotations: c.kwokNodeAnnotations(n.Name),
		},
		Spec: corev1.NodeSpec{Taints: n.Taints},
		// Node create keeps status (pkg/registry/core/node/strategy.go), so
		// capacity and allocatable are set here as a kubelet registering would.
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: alloc},
	}
	if c.opts.MetricsServer {
		// Both address types from the start: kwok's node-initialize stage
		// (run again whenever the node is not Ready) writes an empty
		// addresses list over a node that has an InternalIP but no
		// Hostname, and metrics-server then finds no address to scrape.
		node.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: corev1.NodeHostName, Address: n.Name},
		}
		node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(c.kwokPort)
	}
	if err := c.Client.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	return nil
}

// kwokNodeAnnotations mark a node for kwok and, with metrics-server,
// name kwok's emulated resource metrics path for it.
func (c *Cluster) kwokNodeAnnotations(name string) map[string]string {
	ann := map[string]string{KwokNodeAnnotation: "fake"}
	if c.opts.MetricsServer {
		ann[MetricsResourcePathAnnotation] = kwokNodeMetricsPath(name)
	}
	return ann
}

// NodeReady reports whether node has condition Ready=True.
func (c *Cluster) NodeReady(ctx context.Context, name string) (bool, error) {
	node := &corev1.Node{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return false, err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// kwokConfig is kwok's own stage set (node init, heartbeat, pod lifecycle),
// with the heartbeat period set to the kubelet's, and with metrics its
// resource metrics emulation (kwokMetricsConfig).
func kwokConfig(heartbeat time.Duration, metrics bool) ([]byte, error) {
	hb := map[string]any{}
	if err := yaml.Unmarshal([]byte(nodeheartbeat.DefaultNodeHeartbeat), &hb); err != nil {
		return nil, err
	}
	spec, _ := hb["spec"].(map[string]any)
	if spec == nil {
		return nil, fmt.Errorf("kwok heartbeat stage has no spec")
	}
	ms := heartbeat.Milliseconds()
	spec["delay"] = map[string]any{"durationMilliseconds": ms, "jitterDurationMilliseconds": ms + ms/10}
	hbYAML, err := yaml.Marshal(hb)
	if err != nil {
		return nil, err
	}
	docs := []string{
		nodefast.DefaultNodeInit,
		string(hbYAML),
		podfast.DefaultPodReady,
		podfast.DefaultPodComplete,
		podfast.DefaultPodDelete,
	}
	if metrics {
		docs = append(docs, kwokMetricsConfig()...)
	}
	return []byte(strings.Join(docs, "\n---\n")), nil
}
