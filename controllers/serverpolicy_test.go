package controllers

import (
	"slices"
	"strings"
	"testing"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/serverpolicy"
)

// Every allowed server namespace is excluded from every injector, whatever
// namespace this injector's own server runs in: an injector must never
// block (or mutate) another CR's server pods, nor an oversell server's.
func TestEveryServerNamespaceExcludedFromEveryInjector(t *testing.T) {
	s := testSettings
	s.AllowedNamespaces = []string{"hookwright-system", "mesh-servers", "oversell-servers"}
	for _, own := range []string{"", "mesh-servers"} {
		si := testInjector()
		si.Spec.Server.Namespace = own
		exprs := desired.BuildSidecarInjector(si, s.Settings).Webhook.Webhooks[0].NamespaceSelector.MatchExpressions
		excluded := exprs[len(exprs)-1].Values
		for _, ns := range append(slices.Clone(desired.SystemNamespaces), s.AllowedNamespaces...) {
			if !slices.Contains(excluded, ns) {
				t.Errorf("injector with server namespace %q: %s not excluded (%v)", own, ns, excluded)
			}
		}
	}
}

func TestSettingsServerPolicyDefaults(t *testing.T) {
	p := testSettings.ServerPolicy()
	if !slices.Equal(p.Namespaces, []string{testSettings.Namespace}) || !slices.Equal(p.Images, []string{testSettings.Image}) {
		t.Fatalf("default policy %+v", p)
	}
	if errs := p.Check(v1alpha1.ServerSpec{Namespace: "kube-system"}, v1alpha1.CertificateSpec{}); len(errs) != 1 {
		t.Fatalf("kube-system allowed by default: %v", errs)
	}
}

// The policy's reserved Secret names are the operator's own.
func TestReservedSecretNamesAreTheOperators(t *testing.T) {
	for _, n := range []string{desired.CASecretName, desired.ManagerCertSecretName} {
		if !slices.Contains(serverpolicy.ReservedSecretNames, n) {
			t.Errorf("%s is not reserved", n)
		}
	}
	for _, k := range []desired.Kind{desired.SidecarKind, desired.OversellKind} {
		name := desired.ServingSecretName(desired.CR{Object: testInjector(), Kind: k})
		if !slices.ContainsFunc(serverpolicy.ReservedSecretPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			t.Errorf("%s serving Secret %s is not reserved", k.Short, name)
		}
	}
}
