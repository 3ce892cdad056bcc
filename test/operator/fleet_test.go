package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/rollout"
	"github.com/hookwright/hookwright/test/cluster"
)

// The fleet status of a SidecarInjector: pods created while its server is
// absent (failurePolicy Ignore) are counted missing, injected pods current
// and labelled with the revision, a template change makes them outdated
// and is kept as a second ControllerRevision, pod events that change no
// count write nothing to the CR, and pinning the first revision brings it
// back.
func TestFleetStatus(t *testing.T) {
	ctx := cluster.TestContext(t, 5*time.Minute)
	c := env.Client
	si := scopedInjector(t, "fleet", "sidecar-injection", "fleet", v1alpha1.FailurePolicyIgnore)
	create(t, ctx, si)
	waitConfigured(t, ctx, si, 60*time.Second)
	const ns = "fleet-apps"
	if _, err := env.CreateNamespace(ctx, ns, map[string]string{"sidecar-injection": "fleet"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.DeleteAllOf(context.Background(), &corev1.Pod{}, client.InNamespace(ns), client.GracePeriodSeconds(0))
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	newPod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "fleet"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
	}
	fleetIs := func(what string, want v1alpha1.FleetCounts) {
		t.Helper()
		var got v1alpha1.FleetCounts
		d, err := cluster.Poll(ctx, 200*time.Millisecond, 60*time.Second, what, func(ctx context.Context) (bool, error) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
				return false, err
			}
			if si.Status.Fleet == nil {
				return false, nil
			}
			got = si.Status.Fleet.FleetCounts
			return got == want, nil
		})
		if err != nil {
			t.Fatalf("%v: status.fleet %+v, want %+v", err, got, want)
		}
		t.Logf("%s after %s: %+v", what, d.Round(time.Millisecond), got)
	}

	// No server behind the Service: under Ignore the pods are created bare.
	for i := range 3 {
		p := newPod(fmt.Sprintf("bare-%d", i))
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if injected(p) {
			t.Fatalf("pod %s injected with no server", p.Name)
		}
	}
	fleetIs("pods created during the outage missing", v1alpha1.FleetCounts{MatchedPods: 3, MissingPods: 3})
	condIs(t, ctx, si, v1alpha1.ConditionPodsMissingSidecars, metav1.ConditionTrue, ns+"/bare-0 (should carry")

	// The server serves: new pods are injected and current.
	base := desired.SidecarKind.BaseName(si.Name)
	o := ownedKeys(base, operatorNS)
	o.fetch(t, ctx, "SidecarInjector", si.UID)
	ct := o.Deploy.Spec.Template.Spec.Containers[0]
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "injector-fleet", ct.Args, o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	srv.follow(t, o.Secret)
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(o.Svc) })
	if err := cluster.WaitFor(ctx, 30*time.Second, "the injector serving", func(ctx context.Context) (bool, error) {
		p := newPod("probe")
		if err := c.Create(ctx, p, client.DryRunAll); err != nil {
			return false, err
		}
		return injected(p), nil
	}); err != nil {
		t.Fatalf("%v\ninjector log:\n%s", err, srv.proc.Tail(3000))
	}
	var rev string
	if err := cluster.WaitFor(ctx, 30*time.Second, "status.revision", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(si), si)
		rev = si.Status.Revision
		return rev != "", err
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		p := newPod(fmt.Sprintf("injected-%d", i))
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if !injected(p) || p.Labels[v1alpha1.SidecarRevisionKey] != rev {
			t.Fatalf("pod %s: injected %t, label %s=%q, want status.revision %q", p.Name, injected(p), v1alpha1.SidecarRevisionKey, p.Labels[v1alpha1.SidecarRevisionKey], rev)
		}
	}
	fleetIs("injected pods current", v1alpha1.FleetCounts{MatchedPods: 5, InjectedPods: 2, CurrentPods: 2, MissingPods: 3})
	condIs(t, ctx, si, v1alpha1.ConditionPodsUpToDate, metav1.ConditionTrue, "2 injected pods at the current revision")
	if ns0 := si.Status.Fleet.Namespaces; len(ns0) != 1 || ns0[0].Name != ns || ns0[0].MissingPods != 3 || si.Status.Fleet.NamespacesTotal != 1 {
		t.Errorf("status.fleet.namespaces %+v total %d", ns0, si.Status.Fleet.NamespacesTotal)
	}

	// The lifecycle's own status (the live probe now passing) settles
	// first: what follows counts the fleet's writes.
	waitReachable(t, ctx, si, metav1.ConditionTrue, nil, 90*time.Second)
	// And the writes in flight when it was read have landed: the operator
	// idle, writing nothing (on a loaded machine a status write of the
	// steps before may still be on its way).
	settle(t, ctx)
	if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
		t.Fatal(err)
	}
	// Pod events that change no count: the CR's resourceVersion stays.
	// Every version the CR goes through during them is counted.
	rv := si.ResourceVersion
	versions := map[string]bool{}
	statuses := map[string]string{}
	for i := range 10 {
		p := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("bare-%d", i%3)}, p); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(p.DeepCopy())
		p.Labels["touched"] = fmt.Sprint(i)
		if err := c.Patch(ctx, p, patch); err != nil {
			t.Fatal(err)
		}
		cur := &v1alpha1.SidecarInjector{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), cur); err != nil {
			t.Fatal(err)
		}
		versions[cur.ResourceVersion] = true
	}
	// Past two write intervals, so a delayed write would have landed.
	err := cluster.During(ctx, 2*testFleetWriteInterval+5*time.Second, 500*time.Millisecond, func(ctx context.Context) error {
		cur := &v1alpha1.SidecarInjector{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), cur); err != nil {
			return err
		}
		if !versions[cur.ResourceVersion] {
			b, _ := json.Marshal(cur.Status)
			statuses[cur.ResourceVersion] = string(b)
		}
		versions[cur.ResourceVersion] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	delete(versions, rv)
	t.Logf("10 pod updates changing no count, then 7 s: %d new resourceVersions of the SidecarInjector", len(versions))
	if len(versions) != 0 {
		t.Errorf("quiet fleet wrote the SidecarInjector: new resourceVersions %v; statuses %v", versions, statuses)
	}

	// A template change: a new revision, the injected pods outdated.
	if err := update(ctx, si, func() { cluster.SetProxyImage(si, "ghcr.io/hookwright/proxy:1.5.0") }); err != nil {
		t.Fatal(err)
	}
	fleetIs("injected pods outdated after a template change", v1alpha1.FleetCounts{MatchedPods: 5, InjectedPods: 2, OutdatedPods: 2, MissingPods: 3})
	condIs(t, ctx, si, v1alpha1.ConditionPodsUpToDate, metav1.ConditionFalse, "injected at revision "+rev)
	var revs appsv1.ControllerRevisionList
	if err := cluster.WaitFor(ctx, 30*time.Second, "two ControllerRevisions", func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, &revs, client.InNamespace(operatorNS), client.MatchingLabels{v1alpha1.SidecarInjectorLabelKey: si.Name}); err != nil {
			return false, err
		}
		return len(revs.Items) == 2, nil
	}); err != nil {
		t.Fatalf("%v: %d revisions", err, len(revs.Items))
	}
	for _, r := range revs.Items {
		if len(r.OwnerReferences) != 1 || r.OwnerReferences[0].UID != si.UID {
			t.Errorf("ControllerRevision %s owners %+v", r.Name, r.OwnerReferences)
		}
		t.Logf("ControllerRevision %s revision %d", r.Name, r.Revision)
	}
	pinFirstRevision(t, ctx, si, rev, ns, newPod, fleetIs)
}

// pinFirstRevision is the rollback in one field: spec.revision set to the
// first revision makes the operator copy it into status.pinned, the
// server inject it again and the old pods current.
func pinFirstRevision(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector, rev, ns string, newPod func(string) *corev1.Pod, fleetIs func(string, v1alpha1.FleetCounts)) {
	t.Helper()
	c := env.Client
	if err := update(ctx, si, func() { si.Spec.Revision = rev }); err != nil {
		t.Fatal(err)
	}
	fleetIs("pinned to the first revision, the injected pods current again", v1alpha1.FleetCounts{MatchedPods: 5, InjectedPods: 2, CurrentPods: 2, MissingPods: 3})
	// The fleet's counts and status.revision are written by two
	// controllers, so the counts may come first: wait for both.
	if err := cluster.WaitFor(ctx, 30*time.Second, "status.revision and status.pinned at the first revision", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		return si.Status.Revision == rev && si.Status.Pinned != nil && si.Status.Pinned.Revision == rev, nil
	}); err != nil {
		var pinned string
		if si.Status.Pinned != nil {
			pinned = si.Status.Pinned.Revision
		}
		t.Fatalf("%v: status.revision %q, pinned revision %q; want %s", err, si.Status.Revision, pinned, rev)
	}
	var p *corev1.Pod
	if err := cluster.WaitFor(ctx, 30*time.Second, "the server injecting the pinned revision", func(ctx context.Context) (bool, error) {
		p = newPod("pinned")
		if err := c.Create(ctx, p, client.DryRunAll); err != nil {
			return false, err
		}
		return p.Labels[v1alpha1.SidecarRevisionKey] == rev, nil
	}); err != nil {
		t.Fatalf("%v: label %q", err, p.Labels[v1alpha1.SidecarRevisionKey])
	}
	for _, ct := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if ct.Name == "proxy" && ct.Image != "ghcr.io/hookwright/proxy:1.4.2" {
			t.Errorf("pinned pod's proxy image %s, want the first revision's", ct.Image)
		}
	}
	t.Logf("pinned to %s: new pods get it (labels %v)", rev, p.Labels)
}

// condIs waits for condition typ of si to have status st and a message
// containing msg. The lifecycle reconciler's own status writes may put
// back conditions it read before the fleet's last write, which the fleet
// reconciler then repairs, so conditions are polled like the counts.
func condIs(t *testing.T, ctx context.Context, si *v1alpha1.SidecarInjector, typ string, st metav1.ConditionStatus, msg string) {
	t.Helper()
	var got *metav1.Condition
	if err := cluster.WaitFor(ctx, 30*time.Second, fmt.Sprintf("%s %s (%s)", typ, st, msg), func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), si)
		got = apimeta.FindStatusCondition(si.Status.Conditions, typ)
		return got != nil && got.Status == st && strings.Contains(got.Message, msg), err
	}); err != nil {
		t.Fatalf("%v: %+v", err, got)
	}
}

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
	si := cluster.SampleInjector(t, "owners")
	si.Spec.FailurePolicy = v1alpha1.FailurePolicyIgnore
	create(t, ctx, si)
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
