package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// withValues is cr with every occurrence of old in spec.values replaced.
func withValues(t *testing.T, cr *v1alpha1.SidecarInjector, old, repl string) *v1alpha1.SidecarInjector {
	t.Helper()
	out := cr.DeepCopy()
	raw := strings.ReplaceAll(string(out.Spec.Values.Raw), old, repl)
	if raw == string(out.Spec.Values.Raw) {
		t.Fatalf("values lack %q", old)
	}
	out.Spec.Values = &apiextensionsv1.JSON{Raw: []byte(raw)}
	return out
}

// injectedBy is pod as the engine injects it for cr.
func injectedBy(t *testing.T, cr *v1alpha1.SidecarInjector, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	cfg, err := sidecar.Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(p)
	res, err := sidecar.Inject(cfg, sidecar.Params{OperatorNamespace: "hookwright-system", ServerVersion: "v1.33.0"}, sidecar.Input{Raw: raw, WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatalf("inject: %v", err)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(res.JSON, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func livePod(ns, name string) *corev1.Pod {
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx"}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func fakeCluster(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

// TestCheckInjectLive: a pod injected with an older proxy image is
// outdated and fixable in place; one whose init image also changed needs a
// restart; a bare pod in a selected namespace is missing; one in another
// namespace is not matched.
func TestCheckInjectLive(t *testing.T) {
	si := sampleInjector(t)
	oldImage := withValues(t, si, "proxy:1.4.2", "proxy:1.4.1")
	oldBoth := withValues(t, oldImage, "proxy-init:1.4.2", "proxy-init:1.4.1")
	lab := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{"sidecar-injection": "enabled"}}}
	c := fakeCluster(t, si, lab, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}},
		injectedBy(t, oldImage, livePod("lab", "web-image")), injectedBy(t, oldBoth, livePod("lab", "web-both")),
		livePod("lab", "web-bare"), livePod("other", "web-other"))
	run := func(args ...string) (string, error) {
		cmd := checkInjectCommand(&injectorSource{client: c, kubeVersion: "v1.33.0"})
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		// --kube-version: the fake client does not tell it (nativeSidecars Auto).
		cmd.SetArgs(append([]string{"--kube-version", "v1.33.0"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"-n", "lab", "--live", "web-image"}, []string{
			"pod lab/web-image, SidecarInjector sidecar-injector",
			"state:  Outdated: injected at revision",
			"rule:   pod says nothing and policy is Enabled",
			"change: InPlace: only images",
			"initContainers/proxy changed: image ghcr.io/hookwright/proxy:1.4.1 -> ghcr.io/hookwright/proxy:1.4.2",
		}},
		{[]string{"-n", "lab", "--live", "web-both", "--injector", "sidecar-injector"}, []string{
			"change: Restart: init container proxy-init has already run",
			"initContainers/proxy-init changed: image ghcr.io/hookwright/proxy-init:1.4.1 -> ghcr.io/hookwright/proxy-init:1.4.2",
		}},
		{[]string{"-n", "lab", "--live", "web-bare"}, []string{
			"state:  Missing: should carry the sidecars",
			"change: Restart: sidecars to add",
			"initContainers/proxy-init added",
			"initContainers/proxy added",
		}},
		{[]string{"-n", "other", "--live", "web-other"}, []string{
			"state:  not matched",
			"change: None: not matched: ",
		}},
	}
	for _, tc := range cases {
		got, err := run(tc.args...)
		if err != nil {
			t.Errorf("%v: %v\n%s", tc.args, err, got)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, got)
			}
		}
	}
	if _, err := run("-n", "lab", "--live", "nope"); err == nil || !strings.Contains(err.Error(), "pod lab/nope") {
		t.Errorf("absent pod: %v", err)
	}
	if _, err := run("-n", "lab", "--live", "web-bare", "web-image"); err == nil || !strings.Contains(err.Error(), "--live POD takes") {
		t.Errorf("two pods: %v", err)
	}
}
