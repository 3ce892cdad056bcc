package controllers

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// TestRevisionOfGoneOwnerRemoved: a reconcile that read its
// SidecarInjector before it was deleted (or replaced by one of the same
// name) creates the revision and then removes it, so nothing is left for
// a garbage collector that may no longer know the owner's kind.
func TestRevisionOfGoneOwnerRemoved(t *testing.T) {
	s := testScheme(t)
	for _, tc := range []struct {
		name string
		live func(si *v1alpha1.SidecarInjector) client.Object // nil: gone
		kept bool
	}{
		{name: "owner present", live: func(si *v1alpha1.SidecarInjector) client.Object { return si.DeepCopy() }, kept: true},
		{name: "owner gone"},
		{name: "replaced by a namesake", live: func(si *v1alpha1.SidecarInjector) client.Object {
			o := si.DeepCopy()
			o.UID = types.UID("99999999-2222-3333-4444-555555555555")
			return o
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			si := testInjector()
			b := fake.NewClientBuilder().WithScheme(s)
			if tc.live != nil {
				b = b.WithObjects(tc.live(si))
			}
			c := b.Build()
			k := &revisionKeeper{Client: c, Reader: c, Namespace: "hookwright-system"}
			rev, data := sidecar.Revision(si)
			if _, err := k.keep(context.Background(), si, rev, data); err != nil {
				t.Fatal(err)
			}
			list := &appsv1.ControllerRevisionList{}
			if err := c.List(context.Background(), list); err != nil {
				t.Fatal(err)
			}
			if got := len(list.Items) == 1; got != tc.kept {
				t.Fatalf("%d ControllerRevisions left, want kept=%t", len(list.Items), tc.kept)
			}
		})
	}
}
