package scale

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// bigNamespacePods is Kubernetes' published limit of pods per namespace
// (sig-scalability thresholds.md), the sweep's size; make test's small
// sweep moves smallNamespacePods.
const (
	bigNamespacePods   = 3000
	smallNamespacePods = 300
)

// bigNamespaceFigures are what the relabel of a full namespace measured.
type bigNamespaceFigures struct {
	pods                       int
	created, exact, relabelled time.Duration
	writes                     map[string]int // by SidecarInjector, after the relabel
}

func (b bigNamespaceFigures) rows(from, to string) string {
	others := 0
	for name, n := range b.writes {
		if name != from && name != to {
			others += n
		}
	}
	return fmt.Sprintf("| a namespace of %d pods created for one injector | %s; counts exact %s after the last |\n"+
		"| … relabelled to another injector → both injectors' counts exact | %s |\n"+
		"| … status writes after the relabel: the injector it left / the one it joined / the others | %d / %d / %d |\n",
		b.pods, b.created.Round(time.Millisecond), b.exact.Round(time.Millisecond), b.relabelled.Round(time.Millisecond),
		b.writes[from], b.writes[to], others)
}

// bigNamespace is issue 24's "3,000 pods in one namespace; a namespace
// relabelled with 3,000 pods in it (all re-classified, one status
// write)": a namespace selected by injector from gets pods plain pods
// (missing for it), then its label moves it to injector to.
// Both injectors' counts must be exact after one status write each,
// and no other injector may be written. want are the counts before; it
// returns them after (the namespace stays until the test ends).
func bigNamespace(t *testing.T, ctx context.Context, fast kubernetes.Interface, writes *allWrites, crs []*v1alpha1.SidecarInjector,
	want []v1alpha1.FleetCounts, pods, from, to int, teamLabel, node string, quiet time.Duration) ([]v1alpha1.FleetCounts, bigNamespaceFigures) {
	t.Helper()
	b := bigNamespaceFigures{pods: pods}
	const ns = "sweep-big"
	if _, err := fast.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{teamLabel: strconv.Itoa(from)}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteFleetPods(t, []string{ns}) })
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range pods {
		g.Go(func() error {
			_, err := fast.CoreV1().Pods(ns).Create(gctx, fleetPod(ns, fmt.Sprintf("big-%04d", i), node), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	b.created = time.Since(start)
	in := slices.Clone(want)
	in[from].MatchedPods += int32(pods)
	in[from].MissingPods += int32(pods)
	b.exact = sweepConverges(t, ctx, crs, in, 10*time.Minute)

	if _, err := writes.settle(ctx); err != nil {
		t.Fatal(err)
	}
	before := writes.by()
	moved := slices.Clone(want)
	moved[to].MatchedPods += int32(pods)
	moved[to].MissingPods += int32(pods)
	start = time.Now()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, teamLabel, strconv.Itoa(to))
	if _, err := fast.CoreV1().Namespaces().Patch(ctx, ns, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	sweepConverges(t, ctx, crs, moved, 5*time.Minute)
	b.relabelled = time.Since(start)
	// A second write would come within FleetWriteInterval: the window
	// is longer.
	if err := cluster.During(ctx, quiet, time.Second, func(context.Context) error { return replicas.allExited() }); err != nil {
		t.Fatal(err)
	}
	if _, err := writes.settle(ctx); err != nil {
		t.Fatal(err)
	}
	after := writes.by()
	b.writes = map[string]int{}
	for _, si := range crs {
		b.writes[si.Name] = after[si.Name] - before[si.Name]
	}
	t.Logf("namespace of %d pods:\n%s", pods, b.rows(crs[from].Name, crs[to].Name))
	for i, si := range crs {
		w := 0
		if i == from || i == to {
			w = 1
		}
		if b.writes[si.Name] != w {
			t.Errorf("after the relabel of a namespace of %d pods %s was written %d times, want %d", pods, si.Name, b.writes[si.Name], w)
		}
	}
	return moved, b
}
