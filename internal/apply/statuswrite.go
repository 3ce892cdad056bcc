package apply

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// statusAttempts bounds ApplyStatus's applies on a new resourceVersion.
const statusAttempts = 3

// ApplyStatus writes manager's share of obj's status (StatusObject) with
// server-side apply, forcing ownership of its fields, on obj's
// resourceVersion. orig is the version obj's status was computed from. A
// conflict is read again with reader: when the new version holds the
// same share as orig (another writer's write came between), the apply is
// made again on its resourceVersion; else the conflict is returned, for a
// reconcile on the new version. Afterwards obj has the written
// resourceVersion.
func (s StatusSplit) ApplyStatus(ctx context.Context, c client.Client, reader client.Reader, orig, obj client.Object, manager string) error {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return err
	}
	want, err := s.StatusObject(obj, gvk, manager)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err = c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(manager), client.ForceOwnership)
		if err == nil {
			obj.SetResourceVersion(want.GetResourceVersion())
			return nil
		}
		if !apierrors.IsConflict(err) || reader == nil || attempt == statusAttempts {
			return err
		}
		live := obj.DeepCopyObject().(client.Object)
		if gerr := reader.Get(ctx, client.ObjectKeyFromObject(obj), live); gerr != nil {
			return gerr
		}
		same, serr := s.sameShare(orig, live, manager)
		if serr != nil || !same {
			return err
		}
		want.SetResourceVersion(live.GetResourceVersion())
	}
}

func (s StatusSplit) sameShare(a, b client.Object, manager string) (bool, error) {
	gvk := a.GetObjectKind().GroupVersionKind()
	x, err := s.StatusObject(a, gvk, manager)
	if err != nil {
		return false, err
	}
	y, err := s.StatusObject(b, gvk, manager)
	if err != nil {
		return false, err
	}
	return equality.Semantic.DeepEqual(x.Object["status"], y.Object["status"]), nil
}

// MigrateStatusManagers reads obj with reader (uncached: the cache drops
// managedFields) and, when Update operations of the managers old own
// fields of its status subresource, hands them to the split's managers
// (MigrateStatus) with a JSON patch of metadata.managedFields on the read
// resourceVersion (as kubectl's and client-go's csaupgrade do). It
// reports whether it patched.
func (s StatusSplit) MigrateStatusManagers(ctx context.Context, c client.Client, reader client.Reader, obj client.Object, old []string) (bool, error) {
	live := obj.DeepCopyObject().(client.Object)
	if err := reader.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return false, err
	}
	entries, changed, err := s.MigrateStatus(live.GetManagedFields(), old, gvk.GroupVersion().String(), metav1.Now())
	if err != nil || !changed {
		return false, err
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "replace", "path": "/metadata/managedFields", "value": entries},
		// A replace, not a test: a changed object fails with 409 Conflict.
		{"op": "replace", "path": "/metadata/resourceVersion", "value": live.GetResourceVersion()},
	})
	if err != nil {
		return false, err
	}
	if err := c.Patch(ctx, live, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("hand status fields of %v to %v: %w", old, s.Managers(), err)
	}
	return true, nil
}
