package sidecar

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Watch serves every new version of SidecarInjector name that c's informer
// delivers, as oversell.Store.Watch does for NodeOversells: an informer
// event handler rather than a reconciler, so each update is compiled as
// soon as the watch delivers it, with no work queue between. A version that
// does not compile is counted and logged and the last good one stays; a
// deletion keeps the last loaded version. m records the served generation
// and the rejected versions; c should hold only that one object (a
// metadata.name field selector).
func (s *Store) Watch(ctx context.Context, c cache.Cache, name string, m *Metrics, log logr.Logger) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.SidecarInjector{})
	if err != nil {
		return fmt.Errorf("SidecarInjector informer: %w", err)
	}
	load := func(obj any) {
		cr, ok := obj.(*v1alpha1.SidecarInjector)
		if !ok || cr.Name != name {
			return
		}
		if cur := s.Load(); cur != nil && cur.Generation == cr.Generation && cur.UID == cr.UID {
			return // status-only update or resync
		}
		c, err := s.update(cr)
		if err != nil {
			m.recordConfigError(name)
			log.Error(err, "new SidecarInjector version rejected; still serving the last good one", "generation", cr.Generation)
			return
		}
		m.recordConfig(c)
		log.Info("serving SidecarInjector", "generation", c.Generation, "hash", c.Hash)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    load,
		UpdateFunc: func(_, obj any) { load(obj) },
		DeleteFunc: func(any) {
			log.Info("SidecarInjector deleted; still serving the last loaded version")
		},
	}); err != nil {
		return fmt.Errorf("SidecarInjector event handler: %w", err)
	}
	return nil
}
