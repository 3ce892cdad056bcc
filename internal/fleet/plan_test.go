package fleet

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// tmplInjector is an injector whose only template is tmpl (native sidecars
// as given).
func tmplInjector(t *testing.T, tmpl string, native bool) Injector {
	t.Helper()
	cr := testCR("unused")
	cr.Spec.Templates[0].Template = tmpl
	mode := v1alpha1.NativeSidecarDisabled
	if native {
		mode = v1alpha1.NativeSidecarEnabled
	}
	cr.Spec.NativeSidecars = mode
	cfg, err := sidecar.Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := sidecar.Revision(cr)
	return Injector{Config: cfg, Params: sidecar.Params{OperatorNamespace: "hookwright-system", ServerVersion: "v1.35.0"}, Revision: rev}
}

const (
	proxyV1   = "spec:\n  containers:\n  - name: proxy\n    image: proxy:1\n    env: [{name: A, value: a}]\n    resources: {requests: {cpu: 100m}}\n"
	proxyV2   = "spec:\n  containers:\n  - name: proxy\n    image: proxy:2\n    env: [{name: A, value: a}]\n    resources: {requests: {cpu: 100m}}\n"
	proxyRes  = "spec:\n  containers:\n  - name: proxy\n    image: proxy:1\n    env: [{name: A, value: a}]\n    resources: {requests: {cpu: 200m}}\n"
	proxyEnv  = "spec:\n  containers:\n  - name: proxy\n    image: proxy:1\n    env: [{name: A, value: b}, {name: B, value: x}]\n    resources: {requests: {cpu: 100m}}\n"
	proxyVol  = "spec:\n  containers:\n  - name: proxy\n    image: proxy:1\n    env: [{name: A, value: a}]\n    resources: {requests: {cpu: 100m}}\n    ports: [{containerPort: 15001}]\n"
	proxyTwo  = proxyV1 + "  - name: agent\n    image: agent:1\n"
	withInit  = proxyV1 + "  initContainers:\n  - name: init-net\n    image: init:1\n"
	withInit2 = proxyV1 + "  initContainers:\n  - name: init-net\n    image: init:2\n"
)

func TestPlanPod(t *testing.T) {
	ns := map[string]string{"inject": "on"}
	cases := []struct {
		name           string
		from, to       string
		fromNat, toNat bool
		wantState      State
		wantWay        Way
		wantDiff       []string // "list/name kind field..."
	}{
		{name: "current", from: proxyV1, to: proxyV1, wantState: Current, wantWay: NoChange},
		{name: "image", from: proxyV1, to: proxyV2, wantState: Outdated, wantWay: InPlace, wantDiff: []string{"containers/proxy Changed image"}},
		{name: "resources", from: proxyV1, to: proxyRes, wantState: Outdated, wantWay: InPlace, wantDiff: []string{"containers/proxy Changed resources"}},
		{name: "env", from: proxyV1, to: proxyEnv, wantState: Outdated, wantWay: Restart, wantDiff: []string{"containers/proxy Changed env A,env B"}},
		{name: "uncompared field", from: proxyV1, to: proxyVol, wantState: Outdated, wantWay: Restart},
		{name: "sidecar added", from: proxyV1, to: proxyTwo, wantState: Outdated, wantWay: Restart, wantDiff: []string{"containers/agent Added"}},
		{name: "sidecar removed", from: proxyTwo, to: proxyV1, wantState: Outdated, wantWay: Restart, wantDiff: []string{"containers/agent Removed"}},
		{name: "native image", from: proxyV1, to: proxyV2, fromNat: true, toNat: true, wantState: Outdated, wantWay: InPlace, wantDiff: []string{"initContainers/proxy Changed image"}},
		{name: "native mode", from: proxyV1, to: proxyV1, toNat: true, wantState: Outdated, wantWay: Restart,
			wantDiff: []string{"initContainers/proxy Added", "containers/proxy Removed"}},
		{name: "plain init image", from: withInit, to: withInit2, wantState: Outdated, wantWay: Restart, wantDiff: []string{"initContainers/init-net Changed image"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			from := tmplInjector(t, tc.from, tc.fromNat)
			to := tmplInjector(t, tc.to, tc.toNat)
			p := injected(t, from, pod("apps", "web", nil))
			got, err := PlanPod(to, p, ns)
			if err != nil {
				t.Fatal(err)
			}
			// Planning an outdated pod renders: the fleet's decisions-only
			// injector must say it cannot, not plan nothing.
			if _, err := PlanPod(to.ForDecisions(), p, ns); tc.wantState == Outdated && !errors.Is(err, sidecar.ErrDecisionsOnly) {
				t.Errorf("PlanPod on ForDecisions: %v, want sidecar.ErrDecisionsOnly", err)
			}
			if got.State != tc.wantState || got.Way != tc.wantWay {
				t.Fatalf("state %s way %s (%s), want %s %s; diff %+v", got.State, got.Way, got.Why, tc.wantState, tc.wantWay, got.Containers)
			}
			var diff []string
			for _, d := range got.Containers {
				s := d.List + "/" + d.Name + " " + d.Kind
				var f []string
				for _, c := range d.Changes {
					f = append(f, c.Field)
				}
				if len(f) > 0 {
					s += " " + strings.Join(f, ",")
				}
				diff = append(diff, s)
			}
			if strings.Join(diff, ";") != strings.Join(tc.wantDiff, ";") {
				t.Errorf("diff %q, want %q", diff, tc.wantDiff)
			}
		})
	}
}

func TestPlanPodMissingOrphanedUnmatched(t *testing.T) {
	inj := tmplInjector(t, proxyV1, false)
	miss, err := PlanPod(inj, pod("apps", "bare", nil), map[string]string{"inject": "on"})
	if err != nil || miss.State != Missing || miss.Way != Restart || len(miss.Containers) != 1 || miss.Containers[0].Kind != Added {
		t.Errorf("missing: %+v %v", miss, err)
	}
	orph, err := PlanPod(inj, injected(t, inj, pod("apps", "web", nil)), map[string]string{})
	if err != nil || orph.State != Orphaned || orph.Way != Restart || len(orph.Containers) != 1 || orph.Containers[0].Kind != Removed {
		t.Errorf("orphaned: %+v %v", orph, err)
	}
	un, err := PlanPod(inj, pod("apps", "bare", nil), map[string]string{})
	if err != nil || un.Counted || un.Way != NoChange || !strings.HasPrefix(un.Why, "not matched: ") {
		t.Errorf("unmatched: %+v %v", un, err)
	}
}

func TestStripKeepsThePodsOwn(t *testing.T) {
	inj := tmplInjector(t, proxyV1, false)
	p := pod("apps", "web", map[string]string{"app": "web"})
	got := Strip(injected(t, inj, p))
	if len(got.Spec.Containers) != 1 || got.Spec.Containers[0].Name != "app" || got.Labels["app"] != "web" {
		t.Errorf("strip: %+v", got)
	}
	if _, ok := got.Annotations[v1alpha1.SidecarStatusKey]; ok {
		t.Error("status annotation kept")
	}
	if _, ok := got.Labels[v1alpha1.SidecarRevisionKey]; ok {
		t.Error("revision label kept")
	}
}

func TestDiffContainer(t *testing.T) {
	q := resource.MustParse
	always := corev1.ContainerRestartPolicyAlways
	base := corev1.Container{Name: "p", Image: "i:1", Env: []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("0.1")}}}
	cases := []struct {
		name   string
		mod    func(*corev1.Container)
		want   string
		stored func(*corev1.Container)
	}{
		{"same", func(*corev1.Container) {}, "", nil},
		{"quantity spelled otherwise", func(c *corev1.Container) { c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: q("100m")} }, "", nil},
		{"empty maps", func(c *corev1.Container) { c.Resources.Limits = corev1.ResourceList{} }, "", nil},
		{"image", func(c *corev1.Container) { c.Image = "i:2" }, "image i:1>i:2", nil},
		{"cpu", func(c *corev1.Container) { c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: q("200m")} }, "resources requests cpu=100m>requests cpu=200m", nil},
		{"env removed", func(c *corev1.Container) { c.Env = c.Env[:1] }, "env B 2>", nil},
		{"env order", func(c *corev1.Container) { c.Env = []corev1.EnvVar{c.Env[1], c.Env[0]} }, "env order >", nil},
		{"request defaulted from limit", func(c *corev1.Container) {
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: q("64Mi")}
		}, "", func(c *corev1.Container) {
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: q("64Mi")}
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("64Mi")}
		}},
		{"fieldRef apiVersion defaulted", func(c *corev1.Container) {
			c.Env = append(c.Env, corev1.EnvVar{Name: "P", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
		}, "", func(c *corev1.Container) {
			c.Env = append(c.Env, corev1.EnvVar{Name: "P", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}})
		}},
		{"command", func(c *corev1.Container) { c.Command = []string{"run"} }, "command >run", nil},
		{"restartPolicy", func(c *corev1.Container) { c.RestartPolicy = &always }, "restartPolicy >Always", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			have := base.DeepCopy()
			want := base.DeepCopy()
			tc.mod(want)
			if tc.stored != nil {
				// have is what the API server stored for want.
				tc.stored(have)
			}
			var got []string
			for _, c := range DiffContainer(have, want) {
				got = append(got, c.Field+" "+c.Old+">"+c.New)
			}
			if strings.Join(got, ";") != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
