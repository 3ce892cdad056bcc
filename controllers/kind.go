package controllers

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/health"
)

// kind is what the lifecycle engine (reconciler) needs of one CR kind.
// Optional capabilities are further interfaces a kind may implement,
// found by type assertion: finalizing, afterApplying, watching.
type kind interface {
	// Kind names the kind's objects.
	Kind() desired.Kind
	// New returns an empty CR, NewList an empty list of them.
	New() v1alpha1.Object
	NewList() client.ObjectList
	// Build returns the objects a CR owns.
	Build(cr v1alpha1.Object, s desired.Settings) *desired.Desired
	// ServedGeneration reads the CR named crName's served generation from
	// a server pod's /configz body.
	ServedGeneration(crName string, configz []byte) health.PodServing
}

// finalizing kinds hold a CR being deleted until Finalize reports done;
// the engine first removes the webhooks of its configuration.
type finalizing interface {
	Finalizer() string
	Finalize(ctx context.Context, cr v1alpha1.Object) (done bool, retry time.Duration, err error)
}

// holding finalizing kinds may keep a CR being deleted, webhooks and all,
// while its removal would take from running workloads what they need
// (NodeOversell: nodes whose pods need the amplified allocatable). Hold
// runs before the webhooks are removed; while held is true they stay and
// Finalize waits. Any status it sets is written.
type holding interface {
	Hold(ctx context.Context, cr v1alpha1.Object) (held bool, retry time.Duration, err error)
}

// afterApplying kinds act once the owned objects are in place (and the
// conditions set); they may set status fields and conditions.
type afterApplying interface {
	AfterApply(ctx context.Context, cr v1alpha1.Object) (requeueAfter time.Duration, err error)
}

// watching kinds watch more than the CR and its owned objects; all maps
// any event to every CR of the kind.
type watching interface {
	Watch(b *builder.Builder, all handler.MapFunc) *builder.Builder
}
