package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/explain"
)

func init() {
	subcommands = append(subcommands, newExplainNodeCommand)
}

func newExplainNodeCommand() *cobra.Command {
	var (
		cluster clusterFlags
		out     outputFlags
	)
	cmd := &cobra.Command{
		Use:   "explain-node NODE",
		Short: "Why a node publishes the allocatable it does: raw and effective, ratio and source, the deciding NodeOversell, holds and taints",
		Long: `Read the node, every NodeOversell, the node's pods and (when metrics.k8s.io
is served) their usage, with the kubeconfig kubectl uses (--kubeconfig,
KUBECONFIG, ~/.kube/config or in-cluster; --context picks the context),
and print: capacity, raw and effective allocatable, the ratio in use and
its source (static, usage, fallback, pressure), the NodeOversell whose
server decides it and why it won, the exclusive CPUs subtracted, the
kubelet's last report and when, the running pods' requests and the
headroom, and any taint of ours with its reason. It needs get on the node,
list of nodeoversells and of pods (and metrics.k8s.io pods, optional).
-o json|yaml|jsonpath=... prints the same lines as a NodeExplanation
(kubectl's printers).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			c, _, err := cluster.newClient()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			in := explain.Input{Node: &corev1.Node{}, Now: time.Now()}
			if err := c.Get(ctx, client.ObjectKey{Name: args[0]}, in.Node); err != nil {
				return err
			}
			var nos v1alpha1.NodeOversellList
			if err := c.List(ctx, &nos); err != nil {
				return fmt.Errorf("list NodeOversells: %w", err)
			}
			in.NodeOversells = nos.Items
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.MatchingFields{"spec.nodeName": args[0]}); err != nil {
				return fmt.Errorf("list the node's pods: %w", err)
			}
			in.Pods = pods.Items
			in.Usage, in.UsageTime, in.UsageProblem = podUsage(cmd, c, pods.Items)
			r := explain.Node(in)
			if !out.text() {
				return out.printObject(cmd.OutOrStdout(), "NodeExplanation", r.Node, nodeExplanation(r))
			}
			return r.Write(cmd.OutOrStdout())
		},
	}
	// Nodes are cluster-scoped: no -n.
	cluster.addFlags(cmd.Flags(), "", "")
	out.addFlags(cmd)
	return cmd
}

// explanationLine is one "name: value" line of explain-node.
type explanationLine struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// nodeExplanation is explain-node's -o form: the lines in output order.
func nodeExplanation(r explain.Report) any {
	lines := make([]explanationLine, 0, len(r.Lines))
	for _, l := range r.Lines {
		lines = append(lines, explanationLine{Name: l[0], Value: l[1]})
	}
	return struct {
		Node  string            `json:"node"`
		Lines []explanationLine `json:"lines"`
	}{r.Node, lines}
}

// podUsage sums the metrics.k8s.io usage of the node's running pods; a
// pod without metrics counts as its requests (as the operator counts it).
func podUsage(cmd *cobra.Command, c client.Client, pods []corev1.Pod) (corev1.ResourceList, time.Time, string) {
	var pm metricsv1beta1.PodMetricsList
	if err := c.List(cmd.Context(), &pm); err != nil {
		return nil, time.Time{}, "not served: " + err.Error()
	}
	byName := map[string]*metricsv1beta1.PodMetrics{}
	for i := range pm.Items {
		byName[pm.Items[i].Namespace+"/"+pm.Items[i].Name] = &pm.Items[i]
	}
	sum := corev1.ResourceList{}
	var at time.Time
	add := func(l corev1.ResourceList) {
		for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			v := sum[k]
			v.Add(l[k])
			sum[k] = v
		}
	}
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		m := byName[p.Namespace+"/"+p.Name]
		if m == nil {
			for _, ct := range p.Spec.Containers {
				add(ct.Resources.Requests)
			}
			continue
		}
		if m.Timestamp.After(at) {
			at = m.Timestamp.Time
		}
		for _, ct := range m.Containers {
			add(ct.Usage)
		}
	}
	// Whole millicores: metrics-server's rates come in nanocores.
	cpu := sum[corev1.ResourceCPU]
	sum[corev1.ResourceCPU] = *resource.NewMilliQuantity(cpu.MilliValue(), resource.DecimalSI)
	return sum, at, ""
}
