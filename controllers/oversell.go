package controllers

import (
	"context"
	"encoding/json"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/health"
	"github.com/hookwright/hookwright/internal/oversellnodes"
	"github.com/hookwright/hookwright/internal/requeue"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

// The NodeOversell reconciler reads nodes and writes their status (resync
// touches and restores on deletion).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch

// The overcommit check lists the pods bound to each selected node; the
// targets (internal/oversellnodes/targets.go) list every pod once a pass.
// +kubebuilder:rbac:groups="",resources=pods,verbs=list

// The usage-aware ratio and the pressure back-off read metrics.k8s.io
// (served by metrics-server): node metrics for freshness, pod metrics for
// the usage. Taints need patch on nodes, not granted here: config/node-taints.
// +kubebuilder:rbac:groups=metrics.k8s.io,resources=nodes;pods,verbs=get;list

// OversellFinalizer holds a NodeOversell until every node it amplified has
// its raw allocatable back.
const OversellFinalizer = "oversell.hookwright.io/restore"

// oversellKind adapts NodeOversell to the lifecycle engine: a finalizer
// that restores amplified nodes, the node totals and resync after each
// apply, and a watch on nodes (internal/oversellnodes does the node work).
type oversellKind struct{ nodes *oversellnodes.Nodes }

var (
	_ kind          = oversellKind{}
	_ finalizing    = oversellKind{}
	_ afterApplying = oversellKind{}
	_ watching      = oversellKind{}
	_ holding       = oversellKind{}
)

func (oversellKind) Kind() desired.Kind         { return desired.OversellKind }
func (oversellKind) New() v1alpha1.Object       { return &v1alpha1.NodeOversell{} }
func (oversellKind) NewList() client.ObjectList { return &v1alpha1.NodeOversellList{} }
func (oversellKind) Build(cr v1alpha1.Object, s desired.Settings) *desired.Desired {
	return desired.BuildNodeOversell(cr.(*v1alpha1.NodeOversell), s)
}

// ServedGeneration: an oversell server serves every NodeOversell it accepted.
func (oversellKind) ServedGeneration(crName string, body []byte) health.PodServing {
	var z oversell.Configz
	if err := json.Unmarshal(body, &z); err != nil {
		return health.PodServing{Problem: "unreadable /configz"}
	}
	if !z.Synced {
		return health.PodServing{Problem: "not synced"}
	}
	for _, p := range z.NodeOversells {
		if p.Name == crName {
			return health.PodServing{Generation: p.Generation}
		}
	}
	for _, ig := range z.Ignored {
		if ig.Name == crName {
			return health.PodServing{Generation: 0, Problem: "ignored: " + ig.Reason}
		}
	}
	return health.PodServing{Problem: "not served"}
}

// Finalizer is OversellFinalizer.
func (oversellKind) Finalizer() string { return OversellFinalizer }

// Finalize restores the nodes the NodeOversell amplified.
func (k oversellKind) Finalize(ctx context.Context, cr v1alpha1.Object) (bool, time.Duration, error) {
	k.nodes.Forget(cr.GetName())
	oversellnodes.ForgetMetrics(cr.GetName())
	return k.nodes.Restore(ctx, cr.(*v1alpha1.NodeOversell))
}

// AfterApply sets the node totals and, once per generation, resyncs nodes;
// otherwise it re-amplifies nodes whose status was stored without the
// webhook (internal/oversellnodes/reamplify.go).
//
// First each node's target (internal/oversellnodes/targets.go: the
// usage-aware ratio, holds for running pods, the pressure back-off, the
// release of nodes that left), so the resync that follows touches only
// the nodes whose target did not change.
func (k oversellKind) AfterApply(ctx context.Context, cr v1alpha1.Object) (time.Duration, error) {
	no := cr.(*v1alpha1.NodeOversell)
	targets, _, written, err := k.nodes.Targets(ctx, no)
	if err != nil {
		return 0, err
	}
	before := no.Status.ResyncedGeneration
	after, err := k.nodes.Sync(ctx, no, written)
	after = requeue.Sooner(after, targets)
	if err != nil || no.Status.ResyncedGeneration != before {
		// Just touched every node: the cache has not seen the results.
		return after, err
	}
	again, err := k.nodes.Reamplify(ctx, no)
	return requeue.Sooner(after, again), err
}

// Hold runs while a NodeOversell is being deleted, before its webhooks
// are removed: nodes whose running pods fit their raw allocatable are
// released (restored), the others stay amplified at what their pods need
// (tainted) while the server keeps serving them. held is true while any
// is held; the deletion then waits (Finalize runs once none is).
func (k oversellKind) Hold(ctx context.Context, cr v1alpha1.Object) (bool, time.Duration, error) {
	no := cr.(*v1alpha1.NodeOversell)
	after, held, _, err := k.nodes.Targets(ctx, no)
	return held > 0, after, err
}

// Watch re-reconciles every NodeOversell when a node's labels or oversell
// annotations (applied-by, raw-allocatable, ratios) change. Nodes are
// slimmed in the cache (CacheOptions), and a kubelet status report alone
// must not reconcile anything.
func (oversellKind) Watch(b *builder.Builder, all handler.MapFunc) *builder.Builder {
	return b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(all), builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			if !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) {
				return true
			}
			for _, k := range []string{v1alpha1.OversellAppliedByKey, v1alpha1.OversellRawAllocatableKey, v1alpha1.OversellRatiosKey} {
				if e.ObjectOld.GetAnnotations()[k] != e.ObjectNew.GetAnnotations()[k] {
					return true
				}
			}
			// A status write stored without the webhook.
			return oversellnodes.WriteLostAmplification(e.ObjectOld, e.ObjectNew)
		},
	}))
}
