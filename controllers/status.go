package controllers

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/rollout"
)

// statusWriter writes the CRs' status with server-side apply, each writer
// its own share under its own field manager: the lifecycle reconciler
// under apply.StatusManager, the fleet reconciler and the rollout under
// rollout.FieldManager (rollout.Status says which fields are whose).
// Before its first write of a CR in this process it hands what merge
// patches of earlier versions left owned by the manager "hookwright" to
// those managers, once (apply.StatusSplit.MigrateStatusManagers).
type statusWriter struct {
	client client.Client
	reader client.Reader
	// old are the managers of earlier versions' status merge patches:
	// the image's binary (hookwright) and this process's own (its user
	// agent, as an in-process test's).
	old []string
	// migrated holds the UIDs of the CRs whose managers were handed over.
	migrated sync.Map
}

func newStatusWriter(c client.Client, reader client.Reader) *statusWriter {
	return &statusWriter{client: c, reader: reader, old: []string{apply.FieldManager, filepath.Base(os.Args[0])}}
}

// splitOf is obj's kind's split: a NodeOversell's status has one writer.
func splitOf(obj client.Object) apply.StatusSplit {
	if _, ok := obj.(*v1alpha1.SidecarInjector); ok {
		return rollout.Status
	}
	return apply.StatusSplit{}
}

// write applies manager's share of obj's status; orig is the version it
// was computed from (apply.StatusSplit.ApplyStatus).
func (w *statusWriter) write(ctx context.Context, orig, obj client.Object, manager string) error {
	if err := w.migrate(ctx, obj); err != nil {
		return err
	}
	return splitOf(obj).ApplyStatus(ctx, w.client, w.reader, orig, obj, manager)
}

// migrate hands obj's status fields to the split's managers once per
// process and CR.
func (w *statusWriter) migrate(ctx context.Context, obj client.Object) error {
	if _, done := w.migrated.Load(obj.GetUID()); done {
		return nil
	}
	if _, err := splitOf(obj).MigrateStatusManagers(ctx, w.client, w.reader, obj, w.old); err != nil {
		return err
	}
	w.migrated.Store(obj.GetUID(), struct{}{})
	return nil
}

// forget drops a deleted CR's record.
func (w *statusWriter) forget(uid types.UID) { w.migrated.Delete(uid) }
