package operator

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/rollout"
	"github.com/hookwright/hookwright/test/cluster"
)

// Each writer of a SidecarInjector's status applies its own share under
// its own field manager: the lifecycle reconciler its fields and
// conditions, the fleet reconciler status.fleet, status.rollout and the
// fleet's conditions. A status an earlier version wrote with merge patches
// (what they changed owned by the manager "hookwright") is handed over on
// the first write after the upgrade, so a condition each writer no longer
// sends is removed: ServerRolloutWaiting by the lifecycle, RolloutBlocked
// by the fleet (the CR has no rollout).
func TestStatusWritersOwnTheirShare(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	si := sampleInjector(t, "owners")
	si.Spec.FailurePolicy = v1alpha1.FailurePolicyIgnore
	if err := c.Create(ctx, si); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), si) })
	waitConditions(t, ctx, si, func() []metav1.Condition { return si.Status.Conditions }, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionCertificateReady: metav1.ConditionTrue, v1alpha1.ConditionPodsUpToDate: metav1.ConditionTrue,
	}, 60*time.Second)
	owners := func() map[string][]string {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			t.Fatal(err)
		}
		return statusOwners(t, si)
	}
	checkSplit := func(got map[string][]string) {
		t.Helper()
		fleetShare := []string{v1alpha1.ConditionPodsUpToDate, v1alpha1.ConditionPodsMissingSidecars, "fleet"}
		for m, paths := range got {
			switch m {
			case "Apply " + rollout.FieldManager:
				if !slices.Contains(paths, "fleet") || !slices.Contains(paths, v1alpha1.ConditionPodsUpToDate) {
					t.Fatalf("%s owns %v, want status.fleet and PodsUpToDate", m, paths)
				}
			case "Apply " + apply.StatusManager:
				for _, p := range paths {
					if slices.Contains(fleetShare, p) {
						t.Fatalf("%s owns the fleet's %s (all: %v)", m, p, paths)
					}
				}
			default:
				t.Fatalf("status owned by %s (%v); want only %s and %s", m, paths, apply.StatusManager, rollout.FieldManager)
			}
		}
	}
	checkSplit(owners())

	// The version before: one merge patch of the whole conditions list,
	// under the manager "hookwright", with the operator stopped.
	stopOperator()
	t.Cleanup(func() {
		stopOperator()
		if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
			t.Errorf("restart the operator: %v", err)
		}
	})
	base := si.DeepCopy()
	for _, typ := range []string{v1alpha1.ConditionServerRolloutWaiting, v1alpha1.ConditionRolloutBlocked} {
		apimeta.SetStatusCondition(&si.Status.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue,
			Reason: "Test", Message: "written by the version before", ObservedGeneration: si.Generation})
	}
	if err := c.Status().Patch(ctx, si, client.MergeFrom(base), client.FieldOwner(apply.FieldManager)); err != nil {
		t.Fatal(err)
	}
	// An Update owns what it changed: the two conditions.
	if got := owners()["Update "+apply.FieldManager]; !slices.Contains(got, v1alpha1.ConditionServerRolloutWaiting) || !slices.Contains(got, v1alpha1.ConditionRolloutBlocked) {
		t.Fatalf("the old manager owns %v, want both conditions it wrote", got)
	}
	if err := runOperator(env.Config, allowedServerNamespaces); err != nil {
		t.Fatal(err)
	}
	d := timeUntil(t, ctx, "both stale conditions removed", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		return apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionServerRolloutWaiting) == nil &&
			apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionRolloutBlocked) == nil, nil
	})
	t.Logf("stale conditions removed %s after the restart; conditions now %s", d.Round(time.Millisecond), fmtConds(si.Status.Conditions))
	for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionCertificateReady, v1alpha1.ConditionPodsUpToDate} {
		if apimeta.FindStatusCondition(si.Status.Conditions, typ) == nil {
			t.Fatalf("condition %s gone with the stale ones: %s", typ, fmtConds(si.Status.Conditions))
		}
	}
	checkSplit(owners())
}

// statusOwners lists, by "operation manager", what each managedFields
// entry of obj's status subresource owns: top-level status fields by
// name, conditions by type.
func statusOwners(t *testing.T, obj client.Object) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, e := range obj.GetManagedFields() {
		if e.Subresource != "status" || e.FieldsV1 == nil {
			continue
		}
		var f map[string]map[string]map[string]any
		if err := json.Unmarshal(e.FieldsV1.Raw, &f); err != nil {
			t.Fatal(err)
		}
		var paths []string
		for k, v := range f["f:status"] {
			if k != "f:conditions" {
				paths = append(paths, strings.TrimPrefix(k, "f:"))
				continue
			}
			for key := range v {
				var id struct{ Type string }
				if err := json.Unmarshal([]byte(strings.TrimPrefix(key, "k:")), &id); err == nil && id.Type != "" {
					paths = append(paths, id.Type)
				}
			}
		}
		k := string(e.Operation) + " " + e.Manager
		out[k] = append(out[k], paths...)
	}
	return out
}
