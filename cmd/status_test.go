package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// TestStatusCommand: a bare pod in a selected namespace is missing, a pod
// the engine injected is current, an unselected namespace is not counted;
// tables, --pods and -o json say so.
func TestStatusCommand(t *testing.T) {
	si := sampleInjector(t)
	cfg, err := sidecar.Compile(si)
	if err != nil {
		t.Fatal(err)
	}
	bare := func(ns, name string) *corev1.Pod {
		return &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx"}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	raw, _ := json.Marshal(bare("lab", "web-injected"))
	res, err := sidecar.Inject(cfg, sidecar.Params{OperatorNamespace: "hookwright-system"}, sidecar.Input{Raw: raw, WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatalf("inject: %v", err)
	}
	injected := &corev1.Pod{}
	if err := json.Unmarshal(res.JSON, injected); err != nil {
		t.Fatal(err)
	}
	si.Status.Rollout = &v1alpha1.RolloutStatus{Revision: cfg.Hash, Strategy: v1alpha1.RolloutRestart, Total: 2, Updated: 1, Unavailable: 1,
		Skipped: []v1alpha1.RolloutCount{{Reason: "bare pod: no owner to restart", Count: 1, Pods: []string{"lab/web-bare"}}}}
	since := metav1.NewTime(injected.CreationTimestamp.Add(time.Hour))
	si.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionRolloutBlocked, Status: metav1.ConditionFalse, Reason: "Progressing", Message: "1/2 pods"},
		{Type: v1alpha1.ConditionWebhookReachable, Status: metav1.ConditionTrue, Reason: "Reachable", LastTransitionTime: since},
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(si,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lab", Labels: map[string]string{"sidecar-injection": "enabled"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}},
		bare("lab", "web-bare"), injected, bare("other", "web-other"),
	).Build()
	run := func(args ...string) string {
		t.Helper()
		cmd := statusCommand(&injectorSource{client: c, kubeVersion: "v1.33.0"})
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("status %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	got := run("--pods")
	for _, want := range []string{
		"SidecarInjector sidecar-injector, revision " + cfg.Hash,
		"live  2        1         1        0         1        0",
		"lab        2        1         1        0         1        0",
		"lab        web-bare      Missing  -",
		"should carry the sidecars (pod says nothing and policy is Enabled) and does not",
		"lab        web-injected  Current  " + cfg.Hash,
		"rollout Restart to " + cfg.Hash + ": 1/2 updated, 1 unavailable",
		"  Progressing: 1/2 pods",
		"  skipped 1: bare pod: no owner to restart (lab/web-bare)",
		"before WebhookReachable last became True",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "web-other") {
		t.Errorf("unselected namespace counted:\n%s", got)
	}
	var rep struct {
		Kind  string
		Items []injectorStatus
	}
	if err := json.Unmarshal([]byte(run("sidecar-injector", "-o", "json")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Kind != "List" || len(rep.Items) != 1 || rep.Items[0].Counts.MissingPods != 1 || rep.Items[0].Pods != nil {
		t.Errorf("json %+v", rep)
	}
	if got := run("-o", "name"); got != "sidecarinjectorfleet.cli.hookwright.io/sidecar-injector\n" {
		t.Errorf("-o name: %q", got)
	}
	if got := run("-o", "jsonpath={.items[0].counts.missingPods}"); got != "1" {
		t.Errorf("-o jsonpath: %q", got)
	}
	if y := run("-o", "yaml"); !strings.Contains(y, "missingPods: 1") {
		t.Errorf("yaml:\n%s", y)
	}
	cmd := statusCommand(&injectorSource{client: c})
	cmd.SetArgs([]string{"-o", "xml"})
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `unable to match a printer suitable for the output format "xml"`) {
		t.Errorf("-o xml: %v", err)
	}
}
