package oversellnodes

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/usageratio"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// Event reasons of Targets.
const (
	EventRatiosChanged  = "RatiosChanged"
	EventRatioHeld      = "RatioHeld"
	EventPressure       = "PressureBackoff"
	EventUsageFallback  = "UsageFallback"
	eventTaintForbidden = "NotPermitted"
)

// Reasons of the conditions Targets sets.
const (
	reasonMeasured        = "Measured"
	reasonPodsExceed      = "PodsExceedTarget"
	reasonNothingHeld     = "NothingHeld"
	reasonBackingOff      = "BackingOff"
	reasonNoPressure      = "NoPressure"
	reasonNotPermitted    = "NotPermitted"
	reasonTaintsApplied   = "TaintsApplied"
	heldRecheck           = 10 * time.Second
	maxTargetsMessageList = 10
)

// nodePods is what the running pods on each node of nodes request, and
// each pod's requests by namespace/name: from the pod index when it is
// synced (no API call), else from one list of every pod.
func (n *Nodes) nodePods(ctx context.Context, any bool, nodes iter.Seq[string]) (map[string]*nodePods, func(string) corev1.ResourceList, error) {
	if !any {
		return map[string]*nodePods{}, func(string) corev1.ResourceList { return nil }, nil
	}
	if n.indexed() {
		out := map[string]*nodePods{}
		reqs := map[string]corev1.ResourceList{}
		for name := range nodes {
			ip, ok := n.Pods.NodePods(name)
			if !ok {
				continue
			}
			np := &nodePods{exclusive: ip.Exclusive}
			np.requests[0], np.requests[1] = ip.CPU, ip.Memory
			for key, r := range ip.Pods {
				np.names = append(np.names, key)
				reqs[key] = r
			}
			slices.Sort(np.names)
			out[name] = np
		}
		return out, func(name string) corev1.ResourceList { return reqs[name] }, nil
	}
	var pods corev1.PodList
	if err := n.APIReader.List(ctx, &pods); err != nil {
		return nil, nil, fmt.Errorf("list pods: %w", err)
	}
	podIndex := map[string]*corev1.Pod{}
	for i := range pods.Items {
		podIndex[pods.Items[i].Namespace+"/"+pods.Items[i].Name] = &pods.Items[i]
	}
	return groupPods(pods.Items), func(name string) corev1.ResourceList {
		if p := podIndex[name]; p != nil {
			return podRequests(p)
		}
		return nil
	}, nil
}

// Targets decides every node of no with usageratio.Decide and writes what
// changed: the target annotation and the OversellNodeLabel through
// nodes/status (one merge patch, through the webhook, which applies it at
// once), releases nodes that left no once their pods fit their raw
// allocatable (restorePatch), sets or removes our NoSchedule taint through
// nodes, and then fills no's status: ratioCeiling (lowered only after the
// nodes were), nodesBySource, nodes and the conditions UsageMetrics,
// RatioHeld, Pressure and NodeTaints. It returns when to look again (the
// spec.usage interval, or heldRecheck while a node is held), how many
// nodes are held, and the nodes it wrote.
//
// It acts only once no's webhook is configured and its server available
// (its writes mean nothing before), and for a NodeOversell being deleted
// only on the nodes it still has (all leaving).
func (n *Nodes) Targets(ctx context.Context, no *v1alpha1.NodeOversell) (time.Duration, int, map[string]bool, error) {
	deleting := no.DeletionTimestamp != nil
	if !deleting && (!apimeta.IsStatusConditionTrue(no.Status.Conditions, v1alpha1.ConditionWebhookConfigured) ||
		!apimeta.IsStatusConditionTrue(no.Status.Conditions, v1alpha1.ConditionServerAvailable)) {
		return 0, 0, nil, nil
	}
	cfg, err := usageratio.ConfigFrom(no)
	if err != nil {
		return 0, 0, nil, err
	}
	pol, err := oversell.CompilePolicy(no)
	if err != nil {
		return 0, 0, nil, err
	}
	nodes, err := n.listNodes(ctx)
	if err != nil {
		return 0, 0, nil, err
	}
	var all v1alpha1.NodeOversellList
	if err := n.Client.List(ctx, &all); err != nil {
		return 0, 0, nil, err
	}
	objs := make([]*v1alpha1.NodeOversell, 0, len(all.Items))
	for i := range all.Items {
		objs = append(objs, &all.Items[i])
	}
	snap := oversell.BuildSnapshot(objs, nil, true)

	// The nodes of this pass: those no wins by its selector, and those it
	// still holds (labelled, targeted or amplified by it) that nobody
	// selects any more.
	type work struct {
		node    *corev1.Node
		leaving bool
		// other: another NodeOversell wins the node now; its server
		// applies its ratios (and its pass its floor), only our marks go.
		other bool
	}
	var todo []work
	for i := range nodes {
		nd := &nodes[i]
		p, act := snap.Route(nd.Labels, no.Name)
		if act && p != nil && p.Name == no.Name {
			todo = append(todo, work{node: nd})
			continue
		}
		ours := nd.Labels[v1alpha1.OversellNodeLabel] == no.Name || readNodeTarget(nd, no.Name) != nil ||
			nd.Annotations[v1alpha1.OversellAppliedByKey] == no.Name
		if ours {
			todo = append(todo, work{node: nd, leaving: true, other: p != nil})
		}
	}

	byNode, podReq, err := n.nodePods(ctx, len(todo) > 0, func(yield func(string) bool) {
		for _, w := range todo {
			if !yield(w.node.Name) {
				return
			}
		}
	})
	if err != nil {
		return 0, 0, nil, err
	}
	var mv metricsView
	if cfg.Usage && len(todo) > 0 {
		mv = n.readMetrics(ctx, no)
	}

	now := n.now()
	outs := make([]*nodeOutcome, len(todo))
	inUse := make([][usageratio.NumResources]oversell.Ratio, len(todo))
	written := map[string]bool{}
	var mu sync.Mutex
	var taintForbidden []string
	var taintErrs []string
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resyncWorkers)
	for i, w := range todo {
		nd := w.node
		np := byNode[nd.Name]
		in := usageratio.Input{
			Now:      now,
			Static:   pol.Ratios,
			Ceiling:  pol.Ceiling,
			Raw:      nodeRaw(nd),
			Capacity: nodeCapacity(nd),
			Prev:     readNodeTarget(nd, no.Name),
			Leaving:  w.leaving,
		}
		if np != nil {
			in.Requests = np.requests
			if staticCPUManager(no, nd) {
				in.Exclusive = np.exclusive
			}
		}
		var sample *usageratio.Sample
		if cfg.Usage && !w.leaving {
			sample = mv.sample(nd.Name, np, podReq)
			sample = n.samples.keep(no.Name, nd.Name, sample)
			in.Sample = sample
		}
		d := usageratio.Decide(cfg, in)
		if w.other {
			d = usageratio.Decision{Release: true}
		}
		d.Target.By = no.Name
		out := &nodeOutcome{name: nd.Name, d: d, leaving: w.leaving, sample: sample}
		outs[i] = out
		inUse[i] = d.Ratio
		if in.Prev != nil {
			// Until the write below lands, the node keeps its old ratios.
			for r, rt := range []*v1alpha1.OversellResourceTarget{in.Prev.CPU, in.Prev.Memory} {
				if rt != nil {
					if x, err := oversell.ParseRatio(rt.Ratio); err == nil && x.Micro() > inUse[i][r].Micro() {
						inUse[i][r] = x
					}
				}
			}
		}
		g.Go(func() error {
			var tErr error
			if d.Release {
				// Untaint before the release removes the marks that make
				// a later pass find the node ours: a taint left after them
				// would stay for good. If it fails, the marks stay and the
				// next pass tries again; without the right to patch nodes
				// there is no taint of ours to remove.
				if tErr = n.setTaint(gctx, nd, ""); tErr != nil && !apierrors.IsForbidden(tErr) {
					mu.Lock()
					defer mu.Unlock()
					taintErrs = append(taintErrs, nd.Name+": "+tErr.Error()+" (release deferred)")
					return nil
				}
			}
			wrote, rel, err := n.writeTarget(gctx, no, nd, &d, w.other)
			if err != nil {
				return err
			}
			if !d.Release {
				tErr = n.setTaint(gctx, nd, d.Taint)
			}
			mu.Lock()
			defer mu.Unlock()
			if wrote {
				written[nd.Name] = true
				inUse[i] = d.Ratio // landed: the new ratios apply
			}
			out.released = rel
			switch {
			case tErr == nil:
			case apierrors.IsForbidden(tErr):
				taintForbidden = append(taintForbidden, nd.Name)
			default:
				taintErrs = append(taintErrs, nd.Name+": "+tErr.Error())
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, nil, err
	}
	if len(taintErrs) > 0 {
		log.FromContext(ctx).Info("taint writes failed; retried next pass", "errors", taintErrs)
	}
	held := n.report(ctx, no, cfg, outs, inUse, mv.problem, taintForbidden, deleting)

	var requeue time.Duration
	switch {
	case cfg.Usage && !deleting:
		requeue = durationOr(cfg.Interval, v1alpha1.DefaultUsageInterval)
	case held > 0 || len(taintErrs) > 0:
		requeue = heldRecheck
	}
	if cfg.Usage && held > 0 {
		requeue = min(requeue, heldRecheck)
	}
	return requeue, held, written, nil
}

// lastSamples holds the last good sample per NodeOversell and node: when
// metrics.k8s.io cannot be read (metrics-server restarting), a pass uses
// it until it is older than spec.usage.staleAfter, so a short outage
// moves no ratio; past that the node falls back, the message naming the
// outage. It is memory only: after an operator restart an outage falls
// back at once.
type lastSamples struct {
	mu sync.Mutex
	m  map[string]map[string]*usageratio.Sample
}

// keep records s when it is good and returns it; for a sample whose
// problem is the API's, it returns the last good one, with the problem
// noted, if there is one.
func (l *lastSamples) keep(cr, node string, s *usageratio.Sample) *usageratio.Sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]map[string]*usageratio.Sample{}
	}
	if s.Problem == "" {
		if l.m[cr] == nil {
			l.m[cr] = map[string]*usageratio.Sample{}
		}
		l.m[cr][node] = s
		return s
	}
	if prev := l.m[cr][node]; prev != nil && strings.HasPrefix(s.Problem, metricsUnavailable) {
		c := *prev
		c.Outage = s.Problem
		return &c
	}
	return s
}

// forget drops a NodeOversell's samples.
func (l *lastSamples) forget(cr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, cr)
}

// metricsUnavailable starts the problem of a pass that could not read
// metrics.k8s.io.
const metricsUnavailable = "metrics.k8s.io unavailable"

// readMetrics lists the node and pod metrics (uncached: metrics.k8s.io
// cannot be watched). Any error makes every node fall back, named in
// the problem.
func (n *Nodes) readMetrics(ctx context.Context, no *v1alpha1.NodeOversell) metricsView {
	var nm metricsv1beta1.NodeMetricsList
	if err := n.APIReader.List(ctx, &nm); err != nil {
		targetMetricErrors.WithLabelValues(no.Name).Inc()
		return metricsView{problem: metricsUnavailable + ": " + err.Error()}
	}
	var pm metricsv1beta1.PodMetricsList
	if err := n.APIReader.List(ctx, &pm); err != nil {
		targetMetricErrors.WithLabelValues(no.Name).Inc()
		return metricsView{problem: metricsUnavailable + ": " + err.Error()}
	}
	return newMetricsView(nm.Items, pm.Items)
}

// writeTarget writes one node's decision through nodes/status when it
// differs from what the node carries: the target annotation and our
// label, or, for a released node, the restore patch (raw allocatable
// back, our annotations and label removed; only the label and target when
// marksOnly: another NodeOversell's server amplifies it now). It reports
// whether it wrote and whether the node was released.
func (n *Nodes) writeTarget(ctx context.Context, no *v1alpha1.NodeOversell, nd *corev1.Node, d *usageratio.Decision, marksOnly bool) (bool, bool, error) {
	var patch []byte
	released := false
	if d.Release {
		hasMarks := nd.Labels[v1alpha1.OversellNodeLabel] == no.Name || readNodeTarget(nd, no.Name) != nil
		switch {
		case nd.Annotations[v1alpha1.OversellAppliedByKey] == no.Name && !marksOnly:
			fresh := &corev1.Node{}
			if err := n.APIReader.Get(ctx, client.ObjectKey{Name: nd.Name}, fresh); err != nil {
				return false, false, client.IgnoreNotFound(err)
			}
			rp, notes := restorePatch(fresh)
			var m map[string]any
			_ = json.Unmarshal(rp, &m) // restorePatch's own output
			md := m["metadata"].(map[string]any)
			md["annotations"].(map[string]any)[v1alpha1.OversellTargetKey] = nil
			md["labels"] = map[string]any{v1alpha1.OversellNodeLabel: nil}
			patch, _ = json.Marshal(m)
			if len(notes) > 0 {
				n.Recorder.Eventf(no, nil, corev1.EventTypeWarning, eventRestoreUntrusted, "Restore",
					"recorded raw allocatable not trusted on node %s: %s", nd.Name, strings.Join(notes, ", "))
			}
		case hasMarks:
			patch = fmt.Appendf(nil, `{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, v1alpha1.OversellNodeLabel, v1alpha1.OversellTargetKey)
		default:
			return false, true, nil
		}
		released = true
	} else {
		want := targetJSON(&d.Target)
		if nd.Annotations[v1alpha1.OversellTargetKey] == want && nd.Labels[v1alpha1.OversellNodeLabel] == no.Name {
			return false, false, nil
		}
		patch = fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}}}`,
			v1alpha1.OversellNodeLabel, no.Name, v1alpha1.OversellTargetKey, want)
	}
	target := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.Name}}
	if err := n.Client.Status().Patch(ctx, target, client.RawPatch(types.MergePatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) {
			return false, released, nil
		}
		return false, false, fmt.Errorf("write target of node %s: %w", nd.Name, err)
	}
	targetWrites.WithLabelValues(no.Name).Inc()
	return true, released, nil
}

// setTaint makes node carry our NoSchedule taint with value (or none for
// ""), touching no other taint: it reads the node, and patches spec.taints
// with that read's resourceVersion as a precondition, so a concurrent
// change of another taint is never lost. A conflict (the node changed
// between the read and the patch: a heartbeat, our own target write) is
// retried at once from a new read (client-go's retry.DefaultRetry); a
// release untaints before it removes the marks (Targets), so a taint that
// could not be removed keeps the node ours for the next pass. Tainting
// needs patch on nodes (config/node-taints).
func (n *Nodes) setTaint(ctx context.Context, cached *corev1.Node, value string) error {
	if taintedAs(cached, value) {
		return nil
	}
	wrote := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		fresh := &corev1.Node{}
		if err := n.APIReader.Get(ctx, client.ObjectKey{Name: cached.Name}, fresh); err != nil {
			return err
		}
		if taintedAs(fresh, value) {
			return nil
		}
		body, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": fresh.ResourceVersion},
			"spec":     map[string]any{"taints": withTaint(fresh.Spec.Taints, value)},
		})
		if err := n.Client.Patch(ctx, fresh, client.RawPatch(types.MergePatchType, body)); err != nil {
			return err
		}
		wrote = true
		return nil
	})
	if err != nil {
		return client.IgnoreNotFound(err)
	}
	if wrote {
		taintWrites.WithLabelValues(value).Inc()
	}
	return nil
}

// taintedAs reports whether node already carries our taint with value
// (for "": carries none of ours).
func taintedAs(node *corev1.Node, value string) bool {
	cur, has := ourTaint(node)
	return has == (value != "") && (!has || cur == value)
}

// report fills no's status from a pass and emits an Event for each
// condition whose message changed. It returns how many nodes are held.
func (n *Nodes) report(ctx context.Context, no *v1alpha1.NodeOversell, cfg usageratio.Config, outs []*nodeOutcome,
	inUse [][usageratio.NumResources]oversell.Ratio, apiProblem string, taintForbidden []string, deleting bool) int {
	no.Status.RatioCeiling = ratioCeiling(no, inUse)
	no.Status.Nodes, no.Status.NodesBySource = statusNodes(outs)
	observeTargets(no.Name, outs)

	var changed []string
	var released []string
	for _, o := range outs {
		if o.released {
			released = append(released, o.name)
		} else if o.d.Changed {
			changed = append(changed, fmt.Sprintf("%s cpu %s (%s)", o.name, o.d.Ratio[oversell.CPU], o.d.Source[oversell.CPU]))
		}
	}
	slices.Sort(changed)
	if len(changed) > 0 {
		n.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventRatiosChanged, "Targets",
			"%d nodes got a new ratio: %s", len(changed), summarize(changed, maxTargetsMessageList))
	}
	slices.Sort(released)
	if len(released) > 0 {
		n.Recorder.Eventf(no, nil, corev1.EventTypeNormal, EventNodesRestored, "Restore",
			"raw allocatable restored on %d nodes that left this NodeOversell (their running pods fit it): %s", len(released), summarize(released, maxTargetsMessageList))
	}

	held, stranded := heldSummary(outs)
	slices.Sort(held)
	slices.Sort(stranded)
	if len(held) > 0 {
		msg := fmt.Sprintf("%d nodes held above their target ratio for their running pods (tainted %s=%s:NoSchedule): %s",
			len(held), v1alpha1.OversellTaintKey, v1alpha1.OversellTaintRatioCut, summarize(held, maxTargetsMessageList))
		if len(stranded) > 0 {
			msg += fmt.Sprintf("; %d cannot be held high enough: %s", len(stranded), summarize(stranded, 5))
		}
		n.setConditionEvent(no, v1alpha1.ConditionRatioHeld, true, reasonPodsExceed, truncate(msg, 32000), corev1.EventTypeWarning, EventRatioHeld)
	} else {
		what := "no node is held: every node's running pods fit its target ratio"
		if deleting {
			what = "no node is held: every node's running pods fit its raw allocatable"
		}
		n.setConditionEvent(no, v1alpha1.ConditionRatioHeld, false, reasonNothingHeld, what, "", "")
	}
	if cfg.Usage && !deleting {
		fb, reason := fallbackSummary(outs, apiProblem)
		slices.Sort(fb)
		if len(fb) == 0 && apiProblem != "" {
			n.setConditionEvent(no, v1alpha1.ConditionUsageMetrics, false, "MetricsUnavailable",
				truncate(fmt.Sprintf("%s; %d nodes keep their last measurement until it is older than spec.usage.staleAfter (%s)",
					apiProblem, len(outs), cfg.StaleAfter), 32000), corev1.EventTypeWarning, EventUsageFallback)
		} else if len(fb) > 0 {
			n.setConditionEvent(no, v1alpha1.ConditionUsageMetrics, false, reason,
				truncate(fmt.Sprintf("%d nodes use spec.usage.fallbackRatio: %s", len(fb), summarize(fb, maxTargetsMessageList)), 32000),
				corev1.EventTypeWarning, EventUsageFallback)
		} else {
			n.setConditionEvent(no, v1alpha1.ConditionUsageMetrics, true, reasonMeasured,
				fmt.Sprintf("%d nodes measured through metrics.k8s.io", len(outs)), "", "")
		}
	} else if !cfg.Usage {
		apimeta.RemoveStatusCondition(&no.Status.Conditions, v1alpha1.ConditionUsageMetrics)
	}
	if cfg.Usage && (cfg.PressurePercent[0] > 0 || cfg.PressurePercent[1] > 0) {
		var pr []string
		for _, o := range outs {
			if o.d.Pressure {
				pr = append(pr, o.name)
			}
		}
		slices.Sort(pr)
		if len(pr) > 0 {
			n.setConditionEvent(no, v1alpha1.ConditionPressure, true, reasonBackingOff,
				fmt.Sprintf("%d nodes back off under pressure (ratio 1 or their pods' floor, tainted %s=%s:NoSchedule, nothing evicted): %s",
					len(pr), v1alpha1.OversellTaintKey, v1alpha1.OversellTaintPressure, summarize(pr, maxTargetsMessageList)),
				corev1.EventTypeWarning, EventPressure)
		} else {
			n.setConditionEvent(no, v1alpha1.ConditionPressure, false, reasonNoPressure, "no node is above spec.usage.pressureThreshold", "", "")
		}
	}
	needTaint := false
	for _, o := range outs {
		if o.d.Taint != "" {
			needTaint = true
		}
	}
	switch {
	case len(taintForbidden) > 0:
		slices.Sort(taintForbidden)
		n.setConditionEvent(no, v1alpha1.ConditionNodeTaints, false, reasonNotPermitted,
			fmt.Sprintf("the operator may not patch nodes, so %d nodes lack (or keep) the taint %s: %s; bind the ClusterRole of config/node-taints (hookwright-node-taints) to the operator's ServiceAccount",
				len(taintForbidden), v1alpha1.OversellTaintKey, summarize(taintForbidden, maxTargetsMessageList)),
			corev1.EventTypeWarning, eventTaintForbidden)
	case needTaint:
		n.setConditionEvent(no, v1alpha1.ConditionNodeTaints, true, reasonTaintsApplied,
			"every node held or backing off carries the taint "+v1alpha1.OversellTaintKey, "", "")
	}
	if len(held) > 0 {
		log.FromContext(ctx).V(1).Info("nodes held", "nodes", len(held))
	}
	return len(held)
}

// setConditionEvent sets a condition and, when its message changed and
// an event reason is given, records an Event of that type with it.
func (n *Nodes) setConditionEvent(no *v1alpha1.NodeOversell, typ string, ok bool, reason, msg, eventType, eventReason string) {
	prev := apimeta.FindStatusCondition(no.Status.Conditions, typ)
	if eventReason != "" && (prev == nil || prev.Message != msg) {
		n.Recorder.Eventf(no, nil, eventType, eventReason, "Targets", "%s", msg)
	}
	setCondition(no, typ, ok, reason, msg)
}
