package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
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
