package fleet

import (
	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// NewInjector compiles what cr's servers serve (sidecar.Served: the
// revision pinned by spec.revision once status.pinned holds it, else the
// spec) into the Injector the engine and the classification run. Its
// Params are those of the operator's webhook configuration for settings s
// (operator namespace, desired.InjectorExcludedNamespaces and its spared
// part, desired.InjectorSparedNamespaces) with
// serverVersion, the API server's version that nativeSidecars Auto
// follows ("" means not native). cr need not carry the API server's
// defaults (a file that never met one): sidecar.Revision, sidecar.Compile
// and the desired namespaces apply them, so callers do not.
// The error is sidecar.Compile's; the operator and every CLI command
// build injectors here only, so that all of them judge a pod as the
// servers do.
func NewInjector(cr *v1alpha1.SidecarInjector, s desired.Settings, serverVersion string) (Injector, error) {
	eff, rev, _ := sidecar.Served(cr)
	cfg, err := sidecar.Compile(eff)
	if err != nil {
		return Injector{}, err
	}
	return Injector{Config: cfg, Revision: rev, Params: sidecar.Params{
		OperatorNamespace:  s.Namespace,
		ExcludedNamespaces: desired.InjectorExcludedNamespaces(cr, s),
		SparedNamespaces:   desired.InjectorSparedNamespaces(cr, s),
		ServerVersion:      serverVersion,
	}}, nil
}

// ForDecisions is inj for Classify only: its Config keeps what
// sidecar.Decide reads and drops the parsed templates
// (sidecar.Config.ForDecisions). PlanPod, which renders, fails on it with
// sidecar.ErrDecisionsOnly.
func (inj Injector) ForDecisions() Injector {
	inj.Config = inj.Config.ForDecisions()
	return inj
}
