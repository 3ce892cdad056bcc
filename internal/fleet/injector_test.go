package fleet

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// TestNewInjector: the spec's revision and compiled config, or the pinned
// revision once status.pinned holds it (what the servers serve); the
// webhook configuration's excluded namespaces and the server version in
// Params; a spec that does not compile is an error.
func TestNewInjector(t *testing.T) {
	s := desired.Settings{Namespace: "hookwright-system", AllowedNamespaces: []string{"mesh-servers"}}
	cr := testCR("proxy:2")
	inj, err := NewInjector(cr, s, "v1.33.0")
	if err != nil {
		t.Fatal(err)
	}
	want := testInjector(t, "proxy:2")
	if inj.Revision != want.Revision || inj.Config.Hash != want.Config.Hash {
		t.Errorf("revision %s hash %s, want %s %s", inj.Revision, inj.Config.Hash, want.Revision, want.Config.Hash)
	}
	if inj.Params.OperatorNamespace != "hookwright-system" || inj.Params.ServerVersion != "v1.33.0" ||
		!slices.Contains(inj.Params.ExcludedNamespaces, "mesh-servers") || !slices.Contains(inj.Params.ExcludedNamespaces, "kube-system") {
		t.Errorf("params %+v", inj.Params)
	}

	// An object without the API server's defaults (a file) is built as
	// the stored one: same revision, hash and namespaces.
	bare := cr.DeepCopy()
	bare.Spec.Policy, bare.Spec.NativeSidecars, bare.Spec.Server = "", "", v1alpha1.ServerSpec{}
	if got, err := NewInjector(bare, s, "v1.33.0"); err != nil || got.Revision != inj.Revision || got.Config.Hash != inj.Config.Hash ||
		!slices.Equal(got.Params.ExcludedNamespaces, inj.Params.ExcludedNamespaces) {
		t.Errorf("without defaults: %v %s %s %v, want %s %s %v", err, got.Revision, got.Config.Hash, got.Params.ExcludedNamespaces,
			inj.Revision, inj.Config.Hash, inj.Params.ExcludedNamespaces)
	}

	old := testCR("proxy:1")
	pinned := cr.DeepCopy()
	pinned.Spec.Revision = "mesh-1"
	if inj, err = NewInjector(pinned, s, ""); err != nil || inj.Revision != want.Revision {
		t.Errorf("unresolved pin: %v %s, want the spec's %s", err, inj.Revision, want.Revision)
	}
	pinned.Status.Pinned = &v1alpha1.PinnedRevision{Revision: "mesh-1", Templates: old.Spec.Templates,
		DefaultTemplates: old.Spec.DefaultTemplates, Values: old.Spec.Values}
	inj, err = NewInjector(pinned, s, "")
	if err != nil {
		t.Fatal(err)
	}
	p := injected(t, inj, pod("lab", "web", nil))
	if inj.Revision != "mesh-1" || !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Image == "proxy:1" }) {
		t.Errorf("pinned: revision %s containers %+v, want mesh-1 injecting proxy:1", inj.Revision, p.Spec.Containers)
	}

	bad := testCR("proxy:2")
	bad.Spec.Templates[0].Template = "{{ .Nope"
	if _, err := NewInjector(bad, s, ""); err == nil {
		t.Error("a template that does not parse compiled")
	}
}
