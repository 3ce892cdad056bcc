package controllers

import (
	"encoding/json"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func injectFor(t *testing.T, inj fleet.Injector, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	raw, _ := json.Marshal(p)
	res, err := sidecar.Inject(inj.Config, inj.Params, sidecar.Input{Raw: raw, Namespace: p.Namespace, WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatalf("inject %s: %v %+v", p.Name, err, res)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(res.JSON, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// The fleet compiles an injector with the API server's version, as the
// servers do: with nativeSidecars Auto on v1.29 and later the sidecar is an
// init container, so a pod injected that way and outdated only by its
// image is judged InPlace, not Restart (moving the proxy between lists).
func TestFleetInjectorUsesTheServerVersion(t *testing.T) {
	cr := testInjector()
	cr.Spec.Templates = []v1alpha1.NamedTemplate{{Name: "proxy", Template: "spec:\n  containers:\n  - name: proxy\n    image: {{ .Values.image }}\n"}}
	cr.Spec.DefaultTemplates = []string{"proxy"}
	// The rollout plans pods, which renders: its injector keeps the
	// templates (without a rollout it holds decisions only, below).
	cr.Spec.Rollout.Strategy = v1alpha1.RolloutInPlace
	cr.Default()
	dc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}, FakedServerVersion: &version.Info{GitVersion: "v1.37.2"}}
	r := &fleetReconciler{settings: testSettings, discovery: dc, compiled: map[string]compiledInjector{}}
	inj, err := r.injector(cr)
	if err != nil {
		t.Fatal(err)
	}
	if inj.Params.ServerVersion != "v1.37.2" {
		t.Fatalf("ServerVersion %q, want the API server's", inj.Params.ServerVersion)
	}
	setImage := func(img string) {
		cr.Spec.Values = &apiextensionsv1.JSON{Raw: []byte(`{"image":"` + img + `"}`)}
		cr.Generation++
	}
	setImage("proxy:1")
	old, err := r.injector(cr)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web", UID: types.UID("u")},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}}}
	injected := injectFor(t, old, pod)
	if len(injected.Spec.InitContainers) != 1 || injected.Spec.InitContainers[0].Name != "proxy" {
		t.Fatalf("nativeSidecars Auto on v1.37: proxy not a native sidecar: %+v", injected.Spec)
	}
	setImage("proxy:2")
	cur, err := r.injector(cr)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := fleet.PlanPod(cur, injected, nil)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Way != fleet.InPlace {
		t.Fatalf("an image change of a native sidecar judged %s: %s", plan.Way, plan.Why)
	}
	// Without a rollout the fleet only counts: it holds no templates.
	cr.Spec.Rollout.Strategy = v1alpha1.RolloutNone
	cr.Generation++
	counting, err := r.injector(cr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.PlanPod(counting, injected, nil); !errors.Is(err, sidecar.ErrDecisionsOnly) {
		t.Fatalf("PlanPod with the injector of a CR without rollout: %v, want sidecar.ErrDecisionsOnly", err)
	}
}
