package olm

import (
	"reflect"
	"testing"
)

// NewObjects: what after has and before had not, Events left out, sorted.
func TestNewObjects(t *testing.T) {
	k := func(g, r, ns, n string) ObjectKey { return ObjectKey{Group: g, Resource: r, Namespace: ns, Name: n} }
	before := map[ObjectKey]string{
		k("", "namespaces", "", "hookwright-system"):                 "",
		k("", "configmaps", "hookwright-system", "kube-root-ca.crt"): "",
	}
	after := map[ObjectKey]string{
		k("", "namespaces", "", "hookwright-system"):                                                  "",
		k("", "configmaps", "hookwright-system", "kube-root-ca.crt"):                                  "",
		k("coordination.k8s.io", "leases", "hookwright-system", "hookwright.admission.hookwright.io"): "",
		k("rbac.authorization.k8s.io", "clusterroles", "", "hookwright-metrics-reader"):               "",
		k("", "events", "default", "x.1"):                                                             "",
		k("events.k8s.io", "events", "default", "x.1"):                                                "",
	}
	got := NewObjects(before, after)
	want := []ObjectKey{
		k("rbac.authorization.k8s.io", "clusterroles", "", "hookwright-metrics-reader"),
		k("coordination.k8s.io", "leases", "hookwright-system", "hookwright.admission.hookwright.io"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("NewObjects = %v, want %v", got, want)
	}
	if s := want[1].String(); s != "leases.coordination.k8s.io hookwright-system/hookwright.admission.hookwright.io" {
		t.Errorf("String() = %q", s)
	}
	if s := k("", "namespaces", "", "a").String(); s != "namespaces a" {
		t.Errorf("String() = %q", s)
	}
}
