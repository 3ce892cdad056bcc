package operator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// ConfigLoaded comes from the servers: the operator reads /configz of each
// ready server pod through the API server's pods proxy. The kwok pods'
// IP:9443 are routed (EgressProxy) to one local injector process running
// the Deployment's args with the operator's certificate.
func TestConfigLoadedFromServers(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 4*time.Minute)
	c := env.Client
	si := cluster.SampleInjector(t, "cfg")
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"configloaded-test": "never"}}
	create(t, ctx, si)
	conds := func() []metav1.Condition { return si.Status.Conditions }
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionServerAvailable: metav1.ConditionTrue, v1alpha1.ConditionWebhookConfigured: metav1.ConditionTrue,
	}, 90*time.Second)

	op := desired.SidecarCR(si)
	base := desired.SidecarKind.BaseName(si.Name)
	o := ownedKeys(base, operatorNS)
	var pods []corev1.Pod
	err := cluster.WaitFor(ctx, bound(60*time.Second), "2 ready server pods with IPs", func(ctx context.Context) (bool, error) {
		var list corev1.PodList
		if err := c.List(ctx, &list, client.InNamespace(operatorNS), client.MatchingLabels(desired.SelectorLabels(op))); err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.Status.PodIP != "" && p.DeletionTimestamp == nil && cluster.PodReady(&p) {
				pods = append(pods, p)
			}
		}
		return len(pods) == 2, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing answers on the pods yet: not loaded, pods named.
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{v1alpha1.ConditionConfigLoaded: metav1.ConditionFalse}, 60*time.Second)
	cl := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionConfigLoaded)
	if !strings.Contains(cl.Message, pods[0].Name) || !strings.Contains(cl.Message, "unreachable") {
		t.Fatalf("ConfigLoaded without servers: %+v", cl)
	}
	t.Logf("without servers: %s", cl.Message)

	for _, obj := range []client.Object{o.Deploy, o.Secret} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
	}
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "injector-cfg", o.Deploy.Spec.Template.Spec.Containers[0].Args,
		o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	srv.follow(t, o.Secret)
	targets := make([]string, len(pods))
	for i, p := range pods {
		targets[i] = fmt.Sprintf("%s:%d", p.Status.PodIP, desired.WebhookPort)
		env.Egress.Route(targets[i], srv.Addr())
	}
	t.Cleanup(func() {
		for _, tg := range targets {
			env.Egress.Unroute(tg)
		}
	})
	routed := time.Now()
	waitLoaded := func(what string) {
		t.Helper()
		err := cluster.WaitFor(ctx, bound(60*time.Second), what, func(ctx context.Context) (bool, error) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
				return false, err
			}
			cl := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionConfigLoaded)
			return cl != nil && cl.Status == metav1.ConditionTrue && cl.ObservedGeneration == si.Generation &&
				si.Status.ServedGeneration == si.Generation, nil
		})
		if err != nil {
			t.Fatalf("%v: conditions%s\nserver log:\n%s", err, fmtConds(si.Status.Conditions), srv.proc.Tail(2000))
		}
	}
	waitLoaded("ConfigLoaded True once the pods answer")
	t.Logf("ConfigLoaded True %s after routing the pods: %s", time.Since(routed).Round(time.Millisecond),
		apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionConfigLoaded).Message)

	// A new generation: the server reloads it, the condition follows.
	gen := si.Generation
	if err := update(ctx, si, func() {
		si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"configloaded-test": "still-never"}}
	}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	if si.Generation == gen {
		t.Fatal("generation did not change")
	}
	waitLoaded(fmt.Sprintf("generation %d served", si.Generation))
	t.Logf("generation %d → %d served by both pods %s after the update", gen, si.Generation, time.Since(changed).Round(time.Millisecond))

	// A third replica: its pod (not routed, so its server does not answer)
	// is named as lagging while the two others serve the new generation.
	// (Unrouting a pod would not do: the API server keeps its proxy tunnel
	// open; a replaced pod may get the freed IP back.)
	if err := update(ctx, si, func() { si.Spec.Server.Replicas = ptr.To[int32](3) }); err != nil {
		t.Fatal(err)
	}
	err = cluster.WaitFor(ctx, bound(90*time.Second), "ConfigLoaded False naming only the new pod", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		cl := apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionConfigLoaded)
		return cl != nil && cl.Status == metav1.ConditionFalse && cl.ObservedGeneration == si.Generation &&
			strings.Contains(cl.Message, "1 of 3") && strings.Contains(cl.Message, "unreachable") &&
			!strings.Contains(cl.Message, pods[0].Name) && !strings.Contains(cl.Message, pods[1].Name), nil
	})
	if err != nil {
		t.Fatalf("%v: conditions%s", err, fmtConds(si.Status.Conditions))
	}
	t.Logf("third replica added: %s", apimeta.FindStatusCondition(si.Status.Conditions, v1alpha1.ConditionConfigLoaded).Message)
}
