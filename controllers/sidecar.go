package controllers

import (
	"encoding/json"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/health"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// sidecarKind adapts SidecarInjector to the lifecycle engine.
type sidecarKind struct {
	// revisions keeps the revision history (nil: status.revision only).
	revisions *revisionKeeper
}

var _ kind = sidecarKind{}

func (sidecarKind) Kind() desired.Kind         { return desired.SidecarKind }
func (sidecarKind) New() v1alpha1.Object       { return &v1alpha1.SidecarInjector{} }
func (sidecarKind) NewList() client.ObjectList { return &v1alpha1.SidecarInjectorList{} }
func (sidecarKind) Build(cr v1alpha1.Object, s desired.Settings) *desired.Desired {
	return desired.BuildSidecarInjector(cr.(*v1alpha1.SidecarInjector), s)
}

// ServedGeneration: a SidecarInjector server serves one injector
// (sidecar.Configz.Injector).
func (sidecarKind) ServedGeneration(crName string, body []byte) health.PodServing {
	var z sidecar.Configz
	if err := json.Unmarshal(body, &z); err != nil {
		return health.PodServing{Problem: "unreadable /configz"}
	}
	switch {
	case z.Injector != crName:
		return health.PodServing{Problem: fmt.Sprintf("serves injector %q", z.Injector)}
	case !z.Loaded:
		return health.PodServing{Problem: "not loaded"}
	case z.LastError != "":
		return health.PodServing{Generation: z.Generation, Problem: "newer generation rejected: " + z.LastError}
	}
	return health.PodServing{Generation: z.Generation}
}
