package oversellnodes

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/usageratio"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// The pure part of Targets (targets.go): what one pass reads of nodes,
// pods and metrics, turned into usageratio inputs, and the status it
// reports. No API calls here.

// maxStatusNodes bounds status.nodes (the CRD's maxItems).
const maxStatusNodes = 50

// nodePods is what one node's running pods add up to.
type nodePods struct {
	requests  [usageratio.NumResources]resource.Quantity
	exclusive resource.Quantity // Guaranteed integer-cpu containers' cpu
	names     []string          // namespace/name, for pod metrics
}

// running reports whether p holds resources on its node: bound and not
// terminated (the kubelet releases a pod's resources once it is
// Succeeded or Failed).
func running(p *corev1.Pod) bool {
	return p.Spec.NodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// groupPods sums the running pods per node name.
func groupPods(pods []corev1.Pod) map[string]*nodePods {
	out := map[string]*nodePods{}
	for i := range pods {
		p := &pods[i]
		if !running(p) {
			continue
		}
		np := out[p.Spec.NodeName]
		if np == nil {
			np = &nodePods{}
			out[p.Spec.NodeName] = np
		}
		req := podRequests(p)
		for r, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := req[k]; ok {
				np.requests[r].Add(q)
			}
		}
		np.exclusive.Add(exclusiveCPU(p))
		np.names = append(np.names, p.Namespace+"/"+p.Name)
	}
	return out
}

// exclusiveCPU is the cpu the static CPU manager gives p exclusively: in
// a Guaranteed pod (every container, init containers included, with cpu
// and memory limits equal to requests), each regular or restartable init
// container whose cpu request is a whole number of CPUs
// (pkg/kubelet/cm/cpumanager/policy_static.go, guaranteedCPUs). Regular
// init containers run before the others and reuse their CPUs.
func exclusiveCPU(p *corev1.Pod) resource.Quantity {
	var sum resource.Quantity
	if !guaranteed(p) {
		return sum
	}
	add := func(c *corev1.Container) {
		q := c.Resources.Requests[corev1.ResourceCPU]
		if q.Sign() > 0 && q.MilliValue()%1000 == 0 {
			sum.Add(q)
		}
	}
	for i := range p.Spec.Containers {
		add(&p.Spec.Containers[i])
	}
	for i := range p.Spec.InitContainers {
		c := &p.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	return sum
}

// guaranteed is the Guaranteed QoS class as the kubelet computes it
// (pkg/apis/core/v1/helper/qos: every container has cpu and memory limits,
// and requests, where given, equal them).
func guaranteed(p *corev1.Pod) bool {
	all := append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...)
	if len(all) == 0 {
		return false
	}
	for _, c := range all {
		for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			lim, ok := c.Resources.Limits[k]
			if !ok {
				return false
			}
			if req, ok := c.Resources.Requests[k]; ok && req.Cmp(lim) != 0 {
				return false
			}
		}
	}
	return true
}

// staticCPUManager reports whether node runs the static CPU manager policy
// as far as the operator is told: the admin's node label, or
// spec.staticCPUManagerNodes.
func staticCPUManager(no *v1alpha1.NodeOversell, node *corev1.Node) bool {
	if node.Labels[v1alpha1.CPUManagerPolicyLabel] == "static" {
		return true
	}
	if no.Spec.StaticCPUManagerNodes == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(no.Spec.StaticCPUManagerNodes)
	return err == nil && sel.Matches(labels.Set(node.Labels))
}

// metricsView indexes a pass's reads of metrics.k8s.io.
type metricsView struct {
	problem string // the API could not be read
	nodes   map[string]*metricsv1beta1.NodeMetrics
	pods    map[string]*metricsv1beta1.PodMetrics // by namespace/name
}

func newMetricsView(nodes []metricsv1beta1.NodeMetrics, pods []metricsv1beta1.PodMetrics) metricsView {
	v := metricsView{nodes: map[string]*metricsv1beta1.NodeMetrics{}, pods: map[string]*metricsv1beta1.PodMetrics{}}
	for i := range nodes {
		v.nodes[nodes[i].Name] = &nodes[i]
	}
	for i := range pods {
		v.pods[pods[i].Namespace+"/"+pods[i].Name] = &pods[i]
	}
	return v
}

// sample is one node's measurement: the usage of its running pods (pod
// metrics; a pod metrics-server has not measured yet counts as its
// requests, so a new pod never raises the ratio), at the time of the
// node's own metrics, which also say the node is measured at all. Node
// level usage is not used: it includes what the kubelet's reservations
// already remove from the raw allocatable.
func (v metricsView) sample(node string, pods *nodePods, podReq func(string) corev1.ResourceList) *usageratio.Sample {
	if v.problem != "" {
		return &usageratio.Sample{Problem: v.problem}
	}
	nm := v.nodes[node]
	if nm == nil {
		return &usageratio.Sample{Problem: "no metrics for the node (metrics-server has not scraped it)"}
	}
	// Timestamp is the end of the metrics window (metrics-server's last
	// scrape of the node).
	s := &usageratio.Sample{Time: nm.Timestamp.Time}
	if pods == nil {
		return s
	}
	for _, name := range pods.names {
		pm := v.pods[name]
		if pm == nil {
			req := podReq(name)
			s.Usage[oversell.CPU].Add(req[corev1.ResourceCPU])
			s.Usage[oversell.Memory].Add(req[corev1.ResourceMemory])
			continue
		}
		for _, c := range pm.Containers {
			s.Usage[oversell.CPU].Add(c.Usage[corev1.ResourceCPU])
			s.Usage[oversell.Memory].Add(c.Usage[corev1.ResourceMemory])
		}
	}
	return s
}

// nodeRaw is the node's raw allocatable per resource: the engine's record
// when it has one the engine trusts, else the published value of a node
// no NodeOversell amplified (the kubelet's own). nil where unknown.
func nodeRaw(n *corev1.Node) [usageratio.NumResources]*resource.Quantity {
	var out [usageratio.NumResources]*resource.Quantity
	if raw, _, err := nodeAmounts(n.Annotations, n.Status.Capacity); err == nil && len(raw) > 0 {
		for r, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := raw[k]; ok {
				out[r] = &q
			}
		}
		return out
	}
	if n.Annotations[v1alpha1.OversellAppliedByKey] != "" {
		return out
	}
	for r, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := n.Status.Allocatable[k]; ok {
			out[r] = &q
		}
	}
	return out
}

func nodeCapacity(n *corev1.Node) [usageratio.NumResources]*resource.Quantity {
	var out [usageratio.NumResources]*resource.Quantity
	for r, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := n.Status.Capacity[k]; ok {
			out[r] = &q
		}
	}
	return out
}

// readNodeTarget is the node's target for name, nil when absent, for
// another NodeOversell or unreadable.
func readNodeTarget(n *corev1.Node, name string) *v1alpha1.OversellTarget {
	s, ok := n.Annotations[v1alpha1.OversellTargetKey]
	if !ok {
		return nil
	}
	var t v1alpha1.OversellTarget
	if json.Unmarshal([]byte(s), &t) != nil || t.By != name {
		return nil
	}
	return &t
}

// targetJSON is the annotation value of t.
func targetJSON(t *v1alpha1.OversellTarget) string {
	b, _ := json.Marshal(t) // strings only: cannot fail
	return string(b)
}

// ourTaint is the value of our taint on n, "" when it has none.
func ourTaint(n *corev1.Node) (string, bool) {
	for _, t := range n.Spec.Taints {
		if t.Key == v1alpha1.OversellTaintKey {
			return t.Value, true
		}
	}
	return "", false
}

// withTaint is n's taints with ours set to value ("" removes it); every
// other taint is kept as it is.
func withTaint(taints []corev1.Taint, value string) []corev1.Taint {
	out := make([]corev1.Taint, 0, len(taints)+1)
	for _, t := range taints {
		if t.Key != v1alpha1.OversellTaintKey {
			out = append(out, t)
		}
	}
	if value != "" {
		out = append(out, corev1.Taint{Key: v1alpha1.OversellTaintKey, Value: value, Effect: corev1.TaintEffectNoSchedule})
	}
	return out
}

// nodeOutcome is one node's result in a pass, for the status.
type nodeOutcome struct {
	name     string
	d        usageratio.Decision
	leaving  bool
	sample   *usageratio.Sample
	released bool
}

// rank orders status.nodes: held first, then pressure, fallback, usage.
func (o *nodeOutcome) rank() int {
	switch {
	case len(o.d.Held) > 0:
		return 0
	case o.d.Pressure:
		return 1
	case o.d.Fallback != "":
		return 2
	}
	return 3
}

// notStatic reports whether the node belongs in status.nodes.
func (o *nodeOutcome) notStatic() bool {
	if o.released {
		return false
	}
	if len(o.d.Held) > 0 || o.d.Pressure || o.d.Fallback != "" || o.leaving {
		return true
	}
	for _, s := range o.d.Source {
		if s != "" && s != v1alpha1.RatioSourceStatic {
			return true
		}
	}
	return false
}

// statusNodes is status.nodes and status.nodesBySource of a pass.
func statusNodes(outs []*nodeOutcome) ([]v1alpha1.NodeRatioStatus, map[string]int32) {
	counts := map[string]int32{}
	var list []*nodeOutcome
	for _, o := range outs {
		if o.released {
			continue
		}
		src := o.d.Source[oversell.CPU]
		if src == "" {
			src = o.d.Source[oversell.Memory]
		}
		if src != "" {
			counts[src]++
		}
		if len(o.d.Held) > 0 {
			counts["held"]++
		}
		if o.notStatic() {
			list = append(list, o)
		}
	}
	sort.SliceStable(list, func(i, j int) bool {
		if a, b := list[i].rank(), list[j].rank(); a != b {
			return a < b
		}
		return list[i].name < list[j].name
	})
	if len(list) > maxStatusNodes {
		list = list[:maxStatusNodes]
	}
	var out []v1alpha1.NodeRatioStatus
	for _, o := range list {
		e := v1alpha1.NodeRatioStatus{Name: o.name}
		if o.d.Ratio[oversell.CPU].IsSet() {
			e.CPU = o.d.Ratio[oversell.CPU].String()
		}
		if o.d.Ratio[oversell.Memory].IsSet() {
			e.Memory = o.d.Ratio[oversell.Memory].String()
		}
		e.Source = o.d.Source[oversell.CPU]
		if m := o.d.Source[oversell.Memory]; m != "" && m != e.Source {
			e.Source += "/" + m
		}
		e.Message = truncate(outcomeMessage(o), 512)
		out = append(out, e)
	}
	if len(counts) == 0 {
		counts = nil
	}
	return out, counts
}

// outcomeMessage says why one node has the ratio it has.
func outcomeMessage(o *nodeOutcome) string {
	var parts []string
	if o.leaving {
		parts = append(parts, "left this NodeOversell; raw once its pods fit")
	}
	if len(o.d.Held) > 0 {
		parts = append(parts, "held: "+strings.Join(o.d.Held, "; "))
	}
	if len(o.d.Stranded) > 0 {
		parts = append(parts, "cannot be held: "+strings.Join(o.d.Stranded, "; "))
	}
	if o.d.Pressure {
		parts = append(parts, "pressure back-off")
	}
	if o.d.Fallback != "" {
		parts = append(parts, "fallback: "+o.d.Fallback)
	}
	if o.sample != nil && o.sample.Problem == "" {
		parts = append(parts, fmt.Sprintf("target %s; usage %s", o.d.Want[oversell.CPU], usageratio.UsageString(o.sample)))
	}
	return strings.Join(parts, "; ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// ratioCeiling is status.ratioCeiling after a pass: spec.ratios, or the
// larger ratios some node still has (held). inUse are the ratios each node
// has after the pass (a write that failed keeps its old one).
func ratioCeiling(no *v1alpha1.NodeOversell, inUse [][usageratio.NumResources]oversell.Ratio) *v1alpha1.RatioCeiling {
	var hi [usageratio.NumResources]int64
	for r, s := range []v1alpha1.Ratio{no.Spec.Ratios.CPU, no.Spec.Ratios.Memory} {
		if x, err := oversell.ParseRatio(string(s)); err == nil {
			hi[r] = x.Micro()
		}
	}
	for _, u := range inUse {
		for r := range usageratio.NumResources {
			hi[r] = max(hi[r], u[r].Micro())
		}
	}
	c := &v1alpha1.RatioCeiling{}
	if hi[oversell.CPU] > 0 {
		c.CPU = v1alpha1.Ratio(oversell.RatioMicro(hi[oversell.CPU]).String())
	}
	if hi[oversell.Memory] > 0 {
		c.Memory = v1alpha1.Ratio(oversell.RatioMicro(hi[oversell.Memory]).String())
	}
	return c
}

// heldSummary lines up the held nodes for a condition message.
func heldSummary(outs []*nodeOutcome) (held, stranded []string) {
	for _, o := range outs {
		if len(o.d.Held) > 0 {
			held = append(held, o.name+" ("+strings.Join(o.d.Held, "; ")+")")
		}
		if len(o.d.Stranded) > 0 {
			stranded = append(stranded, o.name+" ("+strings.Join(o.d.Stranded, "; ")+")")
		}
	}
	return held, stranded
}

// fallbackSummary names the nodes on the fallback ratio and the reason
// of the condition: MetricsUnavailable when the API could not be read,
// else StaleMetrics, OutOfRange or NoMetrics from the first node.
func fallbackSummary(outs []*nodeOutcome, apiProblem string) (nodes []string, reason string) {
	for _, o := range outs {
		if o.d.Fallback == "" || o.leaving {
			continue
		}
		nodes = append(nodes, o.name+": "+o.d.Fallback)
		if reason == "" {
			switch f := o.d.Fallback; {
			case apiProblem != "":
				reason = "MetricsUnavailable"
			case strings.Contains(f, "older than"):
				reason = "StaleMetrics"
			case strings.Contains(f, "negative") || strings.Contains(f, "above the capacity"):
				reason = "OutOfRange"
			default:
				reason = "NoMetrics"
			}
		}
	}
	return nodes, reason
}

// durationOr is d, or def when d is 0.
func durationOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
