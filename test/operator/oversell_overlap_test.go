package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/oversellnodes"
	"github.com/hookwright/hookwright/test/cluster"
)

// TestNodeOversellOverlapAndDeselection runs two overlapping NodeOversells
// with the operator and their real servers (the Deployment's args, so
// --node-oversell=<name>): the winner amplifies a kubelet report once; when
// the node's label moves (a nodes write, which no oversell webhook sees) out
// of the winner's selector into the other's only, the operator's restore
// write reaches the other's webhook, which amplifies it from the recorded
// raw; when it moves out of both, the operator restores the real value and
// removes the bookkeeping (no webhook is called for such a node any more).
// Back in both, priority changes and the winner's deletion hand the node
// from one to the other, the raw always exact.
func TestNodeOversellOverlapAndDeselection(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 6*time.Minute)
	c := env.Client
	plainNode(t, ctx, "ovd-node-0", map[string]string{"ovd-pool": "a"})

	mk := func(name string, pools []string, cpu, mem v1alpha1.Ratio, prio int32) *v1alpha1.NodeOversell {
		no := &v1alpha1.NodeOversell{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.NodeOversellSpec{
				NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "ovd-pool", Operator: metav1.LabelSelectorOpIn, Values: pools}}},
				Ratios:       v1alpha1.OversellRatios{CPU: cpu, Memory: mem},
				Priority:     prio,
			},
		}
		create(t, ctx, no)
		waitConfigured(t, ctx, no, 60*time.Second)
		base := desired.OversellKind.BaseName(no.Name)
		o := ownedKeys(base, operatorNS)
		o.fetch(t, ctx, "NodeOversell", no.UID)
		if wh := o.MWC.Webhooks[0]; !reflect.DeepEqual(wh.ObjectSelector, selectorWebhookSelector(no.Spec.NodeSelector)) {
			t.Fatalf("%s: objectSelector %+v, want the nodeSelector %+v", name, wh.ObjectSelector, no.Spec.NodeSelector)
		}
		args := o.Deploy.Spec.Template.Spec.Containers[0].Args
		if !slices.Contains(args, "--node-oversell="+name) {
			t.Fatalf("%s: server args %v", name, args)
		}
		kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
		srv := startLocalServer(t, "oversell-"+name, args, o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
		srv.follow(t, o.Secret)
		if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.UnrouteService(o.Svc) })
		return no
	}
	// ovd-a wins pool a; ovd-b also selects pool a and alone pool b.
	mk("ovd-a", []string{"a"}, "2", "1.5", 10)
	mk("ovd-b", []string{"a", "b"}, "1.5", "1.25", 0)

	expect := func(what, cpu, mem, by string) {
		t.Helper()
		var last string
		err := cluster.WaitFor(ctx, bound(30*time.Second), what, func(ctx context.Context) (bool, error) {
			gotCPU, gotMem, ann := allocOf(t, ctx, "ovd-node-0")
			last = fmt.Sprintf("cpu %s memory %s annotations %v", gotCPU, gotMem, ann)
			if gotCPU != cpu || gotMem != mem || ann[v1alpha1.OversellAppliedByKey] != by {
				return false, nil
			}
			if by == "" {
				for _, k := range []string{v1alpha1.OversellRawAllocatableKey, v1alpha1.OversellRatiosKey} {
					if _, ok := ann[k]; ok {
						return false, nil
					}
				}
				return true, nil
			}
			var raw map[string]string
			if err := json.Unmarshal([]byte(ann[v1alpha1.OversellRawAllocatableKey]), &raw); err != nil {
				return false, nil
			}
			if raw["cpu"] != "3800m" || raw["memory"] != "7Gi" {
				return false, cluster.Permanent(fmt.Errorf("raw-allocatable %v, want 3800m 7Gi (compounded)", raw))
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%v: %s", err, last)
		}
	}

	kubelet, err := kubernetes.NewForConfig(env.KubeletConfig("ovd-node-0"))
	if err != nil {
		t.Fatal(err)
	}
	// kubeletReportAmplifiedByA sends the kubelet's report until ovd-a is
	// the one that amplified it.
	kubeletReportAmplifiedByA := func(what string) {
		t.Helper()
		report := []byte(`{"status":{"allocatable":{"cpu":"3800m","memory":"7Gi"}}}`)
		err := cluster.WaitFor(ctx, bound(30*time.Second), what, func(ctx context.Context) (bool, error) {
			n, err := kubelet.CoreV1().Nodes().Patch(ctx, "ovd-node-0", types.StrategicMergePatchType, report, metav1.PatchOptions{}, "status")
			if err != nil {
				return false, err
			}
			return n.Annotations[v1alpha1.OversellAppliedByKey] == "ovd-a", nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	kubeletReportAmplifiedByA("kubelet report amplified once by the winner")
	expect("ovd-a amplifies through both webhooks", "7600m", "10752Mi", "ovd-a")

	relabel := func(pool string) {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: "ovd-node-0"}, n); err != nil {
			t.Fatal(err)
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"ovd-pool":%q}}}`, pool)
		if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
	}
	relabel("b")
	d := timeUntil(t, ctx, "ovd-b took the node over", func(ctx context.Context) (bool, error) {
		_, _, ann := allocOf(t, ctx, "ovd-node-0")
		return ann[v1alpha1.OversellAppliedByKey] == "ovd-b", nil
	})
	expect("the operator's restore write amplified by ovd-b from the recorded raw", "5700m", "8960Mi", "ovd-b")
	t.Logf("label moved to ovd-b's pool: taken over %s later without a kubelet write", d.Round(time.Millisecond))

	relabel("none")
	expect("no NodeOversell selects the node: the operator restores it", "3800m", "7Gi", "")
	awaitEvent(t, ctx, "NodeOversell", "ovd-b", oversellnodes.EventNodesRestored)

	// Back in both selectors: a kubelet report is amplified once, by ovd-a.
	relabel("a")
	kubeletReportAmplifiedByA("kubelet report amplified by ovd-a again")
	expect("ovd-a amplifies again", "7600m", "10752Mi", "ovd-a")
	// Priority changes reach the node through the operator's resync touch.
	setPriority := func(name string, p int32) {
		no := &v1alpha1.NodeOversell{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, no); err != nil {
			t.Fatal(err)
		}
		if err := update(ctx, no, func() { no.Spec.Priority = p }); err != nil {
			t.Fatal(err)
		}
	}
	setPriority("ovd-a", -1)
	expect("ovd-a priority -1: ovd-b wins", "5700m", "8960Mi", "ovd-b")
	setPriority("ovd-a", 20)
	expect("ovd-a priority 20: ovd-a wins again", "7600m", "10752Mi", "ovd-a")
	// Deleting the winner: its finalizer's restore write reaches ovd-b's
	// webhook, which amplifies it from the recorded raw.
	if err := c.Delete(ctx, &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "ovd-a"}}); err != nil {
		t.Fatal(err)
	}
	expect("ovd-a deleted: ovd-b takes the node over", "5700m", "8960Mi", "ovd-b")
	err = cluster.WaitFor(ctx, bound(60*time.Second), "ovd-a gone", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: "ovd-a"}, &v1alpha1.NodeOversell{})
		return err != nil && client.IgnoreNotFound(err) == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatal(err)
	}
	relabel("none")
	expect("out of ovd-b's selector: restored", "3800m", "7Gi", "")
}
