package controllers

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

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

// TestRevisionOfGoneOwnerRemovedWhileStopping: the manager stopping
// (its context cancelled during the create, as at an uninstall that
// deletes the CRDs and the operator at once) or the CRD already gone
// (NoKindMatch) still ends with the revision of a deleted
// SidecarInjector removed.
func TestRevisionOfGoneOwnerRemovedWhileStopping(t *testing.T) {
	s := testScheme(t)
	honourCancel := interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return c.List(ctx, list, opts...)
		},
	}
	for _, tc := range []struct {
		name   string
		reader func(c client.WithWatch) client.Reader
	}{
		{name: "context cancelled during the create", reader: func(c client.WithWatch) client.Reader {
			return interceptor.NewClient(c, honourCancel)
		}},
		{name: "CRD gone", reader: func(c client.WithWatch) client.Reader {
			return interceptor.NewClient(c, interceptor.Funcs{
				Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
					return &meta.NoKindMatchError{GroupKind: v1alpha1.GroupVersion.WithKind("SidecarInjector").GroupKind()}
				},
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			si := testInjector()
			base := fake.NewClientBuilder().WithScheme(s).Build()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := interceptor.NewClient(base, interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					err := c.Create(ctx, obj, opts...)
					cancel() // SIGTERM: the manager cancels every reconcile
					return err
				},
			})
			k := &revisionKeeper{Client: w, Reader: tc.reader(base), Namespace: "hookwright-system"}
			rev, data := sidecar.Revision(si)
			if _, err := k.keep(ctx, si, rev, data); err != nil {
				t.Fatal(err)
			}
			list := &appsv1.ControllerRevisionList{}
			if err := base.List(context.Background(), list); err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != 0 {
				t.Fatalf("%d ControllerRevisions of a deleted SidecarInjector left", len(list.Items))
			}
		})
	}
}
