// Package configwatch is the thin shell between the webhook servers'
// informers and their engines' stores: SidecarInjector feeds one
// SidecarInjector's versions to a sidecar.Store (the injector), and
// NodeOversells every NodeOversell to an oversell.Store (the oversell
// server). Each registers an informer event handler on a controller-runtime
// cache rather than a reconciler, so each update reaches the store as soon
// as the watch delivers it, with no work queue between; what a version
// means (compile, keep the last good one, snapshot) is decided in the
// engines.
//
// The engines must stay free of Kubernetes clients (their package docs;
// test/imports), so the informers live here, imported only by cmd/. This
// package may import both engines and controller-runtime's cache; it must
// not import the operator (controllers, internal/).
package configwatch

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// SidecarInjector offers every version of SidecarInjector name that c's
// informer delivers to s (sidecar.Store.Offer: compiled at once, a version
// that does not compile is counted in m and logged, the last good one
// stays). A deletion keeps the last loaded version. c should hold only that
// one object (a metadata.name field selector). Call it before the cache
// starts; it returns the informer lookup or registration error.
func SidecarInjector(ctx context.Context, c cache.Cache, s *sidecar.Store, name string, m *sidecar.Metrics, log logr.Logger) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.SidecarInjector{})
	if err != nil {
		return fmt.Errorf("SidecarInjector informer: %w", err)
	}
	offer := func(obj any) {
		if cr, ok := obj.(*v1alpha1.SidecarInjector); ok {
			s.Offer(name, cr, m, log)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    offer,
		UpdateFunc: func(_, obj any) { offer(obj) },
		DeleteFunc: func(any) {
			log.Info("SidecarInjector deleted; still serving the last loaded version")
		},
	}); err != nil {
		return fmt.Errorf("SidecarInjector event handler: %w", err)
	}
	return nil
}

// NodeOversells registers s on c's NodeOversell informer (adds and updates
// are upserted, deletions removed, tombstones of missed deletions
// unwrapped) and marks s synced once the handler has seen the initial
// list. Call it before the cache starts; it returns the informer lookup or
// registration error.
func NodeOversells(ctx context.Context, c cache.Cache, s *oversell.Store, log logr.Logger) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.NodeOversell{})
	if err != nil {
		return fmt.Errorf("NodeOversell informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := nodeOversell(obj); ok {
				s.Upsert(o)
			}
		},
		UpdateFunc: func(_, obj any) {
			if o, ok := nodeOversell(obj); ok {
				s.Upsert(o)
			}
		},
		DeleteFunc: func(obj any) {
			if o, ok := nodeOversell(obj); ok {
				s.Remove(o.Name)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("NodeOversell event handler: %w", err)
	}
	go func() {
		if toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			s.MarkSynced()
			log.Info("NodeOversell configuration synced")
		}
	}()
	return nil
}

// nodeOversell extracts a NodeOversell from an informer event payload,
// including the tombstone delivered for missed deletions.
func nodeOversell(obj any) (*v1alpha1.NodeOversell, bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(*v1alpha1.NodeOversell)
	return o, ok
}

// MarkGone keeps gone true while the object of obj's kind named name is
// being deleted or absent after a deletion, as c's informer delivers it,
// and false while it exists (a CR deleted and created again under its
// name serves calls again). A server's listener reads it when it shuts
// down (listener.Options.Unreachable): a webhook whose CR is going has no
// caller left to wait for. Call it before the cache starts; it returns
// the informer lookup or registration error.
func MarkGone(ctx context.Context, c cache.Cache, obj client.Object, name string, gone *atomic.Bool) error {
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return fmt.Errorf("%T informer: %w", obj, err)
	}
	seen := func(o any) {
		if m, ok := o.(metav1.Object); ok && m.GetName() == name {
			gone.Store(m.GetDeletionTimestamp() != nil)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, o any) { seen(o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if m, ok := o.(metav1.Object); ok && m.GetName() == name {
				gone.Store(true)
			}
		},
	}); err != nil {
		return fmt.Errorf("%T event handler: %w", obj, err)
	}
	return nil
}
