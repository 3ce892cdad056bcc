package operator

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// resyncNodes is the node count of the issue's resync goal ("all selected
// nodes reflect a change within 5 s for 100 nodes").
const resyncNodes = 100

// parallel runs f(i) for i in [0, n) on up to limit goroutines and returns
// the first error.
func parallel(n, limit int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, limit)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// A ratio change of a NodeOversell over 100 nodes reaches every node's
// allocatable through the operator's nodes/status touch (no kubelet
// report), timed from the CR update until the last node shows it. The
// issue's goal is 5 s; the test fails only past a generous 60 s (loaded CI)
// and logs the figure.
func TestNodeOversellResync100Nodes(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 8*time.Minute)
	c := env.Client
	const pool = "resync-scale"
	names := make([]string, resyncNodes)
	for i := range names {
		names[i] = fmt.Sprintf("scale-node-%03d", i)
	}
	start := time.Now()
	err := parallel(resyncNodes, 10, func(i int) error {
		return c.Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{"pool": pool}},
			// No pod of another test lands here.
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: cluster.SimulatedKubeletTaint, Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{
				Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")},
				Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3800m"), corev1.ResourceMemory: resource.MustParse("7Gi"), corev1.ResourcePods: resource.MustParse("110")},
			},
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = parallel(resyncNodes, 10, func(i int) error {
			return client.IgnoreNotFound(env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i]}}))
		})
	})
	t.Logf("%d nodes created in %s", resyncNodes, time.Since(start).Round(time.Millisecond))

	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "resync-scale"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		},
	}
	create(t, ctx, no)
	conds := func() []metav1.Condition { return no.Status.Conditions }
	waitConditions(t, ctx, no, conds, configured, 60*time.Second)
	base := desired.OversellKind.BaseName(no.Name)
	o := ownedKeys(base, operatorNS)
	o.fetch(t, ctx, "NodeOversell", no.UID)
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "oversell-scale", o.Deploy.Spec.Template.Spec.Containers[0].Args,
		o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	srv.follow(t, o.Secret)
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(o.Svc) })

	// Each node's kubelet reports once: stored amplified (×2).
	start = time.Now()
	err = parallel(resyncNodes, 10, func(i int) error {
		kubelet, err := kubernetes.NewForConfig(env.KubeletConfig(names[i]))
		if err != nil {
			return err
		}
		report := []byte(`{"status":{"allocatable":{"cpu":"3800m","memory":"7Gi"}}}`)
		return cluster.WaitFor(ctx, bound(60*time.Second), names[i]+" report amplified", func(ctx context.Context) (bool, error) {
			n, err := kubelet.CoreV1().Nodes().Patch(ctx, names[i], types.StrategicMergePatchType, report, metav1.PatchOptions{}, "status")
			if err != nil {
				return false, err
			}
			return n.Status.Allocatable.Cpu().String() == "7600m", nil
		})
	})
	if err != nil {
		t.Fatalf("%v\noversell log:\n%s", err, srv.proc.Tail(3000))
	}
	t.Logf("%d kubelet reports amplified in %s", resyncNodes, time.Since(start).Round(time.Millisecond))
	err = cluster.WaitFor(ctx, bound(120*time.Second), "server available, every node amplified, generation resynced", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(no), no); err != nil {
			return false, err
		}
		return metaCond(no.Status.Conditions, v1alpha1.ConditionServerAvailable) != "" &&
			no.Status.NodesAmplified == resyncNodes && no.Status.ResyncedGeneration == no.Generation, nil
	})
	if err != nil {
		t.Fatalf("%v: status %+v", err, no.Status)
	}
	waitConditions(t, ctx, no, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionServerAvailable: metav1.ConditionTrue}, 90*time.Second)

	// The change: ratio 2 → 3, timed until the last node shows 11400m.
	allShow := func(cpu string) func(context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			var list corev1.NodeList
			if err := c.List(ctx, &list, client.MatchingLabels{"pool": pool}); err != nil {
				return 0, err
			}
			n := 0
			for _, node := range list.Items {
				if node.Status.Allocatable.Cpu().String() == cpu {
					n++
				}
			}
			return n, nil
		}
	}
	var took []time.Duration
	for _, step := range []struct{ ratio, cpu string }{{"3", "11400m"}, {"2.5", "9500m"}, {"3", "11400m"}, {"2", "7600m"}} {
		if err := update(ctx, no, func() { no.Spec.Ratios.CPU = v1alpha1.Ratio(step.ratio) }); err != nil {
			t.Fatal(err)
		}
		changed := time.Now()
		count := allShow(step.cpu)
		var n int
		var half time.Duration
		var countErr error
		_, _ = cluster.Poll(ctx, 20*time.Millisecond, bound(60*time.Second), "nodes resynced", func(ctx context.Context) (bool, error) {
			if n, countErr = count(ctx); countErr != nil {
				return false, cluster.Permanent(countErr)
			}
			if half == 0 && n >= resyncNodes/2 {
				half = time.Since(changed)
			}
			return n == resyncNodes, nil
		})
		if countErr != nil {
			t.Fatal(countErr)
		}
		d := time.Since(changed)
		if n != resyncNodes {
			t.Fatalf("ratio %s: %d of %d nodes show cpu %s after %s", step.ratio, n, resyncNodes, step.cpu, d.Round(time.Millisecond))
		}
		t.Logf("ratio → %s: all %d nodes show cpu %s %s after the CR update (half of them after %s; goal 5 s)",
			step.ratio, resyncNodes, step.cpu, d.Round(time.Millisecond), half.Round(time.Millisecond))
		took = append(took, d)
	}
	slices.Sort(took)
	t.Logf("resync of %d nodes over %d ratio changes: min %s, median %s, max %s (goal 5 s)", resyncNodes, len(took),
		took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))

	// Deletion restores all of them before the CR goes.
	if err := c.Delete(ctx, no); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = cluster.WaitFor(ctx, bound(120*time.Second), "NodeOversell gone", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(no), &v1alpha1.NodeOversell{})
		return client.IgnoreNotFound(err) == nil && err != nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatal(err)
	}
	restored, err := allShow("3800m")(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NodeOversell over %d nodes deleted in %s, %d restored to 3800m", resyncNodes, time.Since(start).Round(time.Millisecond), restored)
	if restored != resyncNodes {
		t.Fatalf("%d of %d nodes restored", restored, resyncNodes)
	}
}
