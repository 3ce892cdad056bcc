package operator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// With the injector down and failurePolicy Fail (in effect once the
// injector answered), a pod that opted out with
// the inject=false label is still created: the webhook's objectSelector
// keeps it from the injector. Once the injector serves, a pod whose status
// annotation names containers it lacks (a copied pod spec) is injected
// again through the API server.
func TestInjectorOutageSparesOptedOutPods(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 4*time.Minute)
	c := env.Client
	si := scopedInjector(t, "optout", "sidecar-injection", "optout", v1alpha1.FailurePolicyFail)
	create(t, ctx, si)
	waitConfigured(t, ctx, si, 60*time.Second)
	const ns = "optout-apps"
	if _, err := env.CreateNamespace(ctx, ns, map[string]string{"sidecar-injection": "optout"}); err != nil {
		t.Fatal(err)
	}
	pod := func(labels, annotations map[string]string, containers ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: ns, Labels: labels, Annotations: annotations}}
		for _, n := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n, Image: "nginx:1.27"})
		}
		return p
	}

	// Fail takes effect once the injector answered; then it goes away.
	o, first := armFail(t, ctx, si, "injector-optout-0")
	env.UnrouteService(o.Svc)
	if err := first.proc.Stop(5 * time.Second); err != nil {
		t.Logf("stop: %v", err)
	}
	// Nothing serves the Service: a pod that says nothing is refused.
	var refused error
	err := cluster.WaitFor(ctx, bound(60*time.Second), "an unlabelled pod refused while the injector is down", func(ctx context.Context) (bool, error) {
		refused = c.Create(ctx, pod(nil, nil, "app"), client.DryRunAll)
		return refused != nil && strings.Contains(refused.Error(), "failed calling webhook"), nil
	})
	if err != nil {
		t.Fatalf("%v; last: %v", err, refused)
	}
	t.Logf("unlabelled pod refused: %v", refused)
	for _, v := range []string{"false", "OFF", "no"} {
		p := pod(map[string]string{v1alpha1.SidecarInjectKey: v}, nil, "app")
		if err := c.Create(ctx, p, client.DryRunAll); err != nil {
			t.Errorf("pod labelled %s=%s refused during the outage: %v", v1alpha1.SidecarInjectKey, v, err)
		} else if injected(p) {
			t.Errorf("pod labelled %s=%s injected", v1alpha1.SidecarInjectKey, v)
		}
	}
	// The annotation cannot be selected on: it still needs the injector.
	if err := c.Create(ctx, pod(nil, map[string]string{v1alpha1.SidecarInjectKey: "false"}, "app"), client.DryRunAll); err == nil {
		t.Error("pod annotated inject=false admitted without the injector")
	}

	// The injector serves: a copied pod with a stale status is injected.
	o.fetch(t, ctx, "SidecarInjector", si.UID)
	base := o.SA.Name
	ct := o.Deploy.Spec.Template.Spec.Containers[0]
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "injector-optout", ct.Args, o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	srv.follow(t, o.Secret)
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(o.Svc) })
	stale, _ := json.Marshal(map[string]any{"injector": si.Name, "templates": []string{"proxy"},
		"initContainers": []string{"proxy-init"}, "containers": []string{"proxy"}})
	var p *corev1.Pod
	err = cluster.WaitFor(ctx, bound(30*time.Second), "a pod with a stale status annotation injected", func(ctx context.Context) (bool, error) {
		p = pod(nil, map[string]string{v1alpha1.SidecarStatusKey: string(stale)}, "app")
		if err := c.Create(ctx, p, client.DryRunAll); err != nil {
			return false, err
		}
		return len(p.Spec.Containers)+len(p.Spec.InitContainers) > 1, nil
	})
	if err != nil {
		t.Fatalf("%v\ninjector log:\n%s", err, srv.proc.Tail(3000))
	}
	var names []string
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); !strings.Contains(got, "proxy-init") || !strings.Contains(got, "proxy") || p.Annotations[v1alpha1.SidecarStatusKey] == string(stale) {
		t.Fatalf("re-injected pod has containers %s, status %s", got, p.Annotations[v1alpha1.SidecarStatusKey])
	}
	t.Logf("stale status re-injected: containers %s", strings.Join(names, ","))
	// A pod whose status containers are all there is left alone.
	whole := pod(nil, map[string]string{v1alpha1.SidecarStatusKey: string(stale)}, "app", "proxy")
	whole.Spec.InitContainers = []corev1.Container{{Name: "proxy-init", Image: "busybox"}}
	if err := c.Create(ctx, whole, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	if len(whole.Spec.Containers) != 2 || len(whole.Spec.InitContainers) != 1 || whole.Annotations[v1alpha1.SidecarStatusKey] != string(stale) {
		t.Fatalf("already-injected pod changed: %+v", whole.Spec)
	}
}
