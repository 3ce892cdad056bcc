package validation

import (
	"os"
	"strings"
	"testing"
	"text/template"
	"unicode/utf8"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/oversell"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func TestUnquotedPodValues(t *testing.T) {
	for _, tc := range []struct {
		name, tmpl string
		want       []string // one substring per expected warning, in order
	}{
		{"values only", `image: {{ .Values.image }} ns: {{ .Namespace }} by: {{ .Injector }}`, nil},
		{"quoted annotation", `v: {{ annotation .ObjectMeta "k" "d" | quote }}`, nil},
		{"unquoted annotation", `v: {{ annotation .ObjectMeta "k" "d" }}`, []string{`x:1:6: {{annotation .ObjectMeta "k" "d"}} prints`}},
		{"label helper", `v: {{ label .ObjectMeta "app" "x" }}`, []string{"label .ObjectMeta"}},
		{"podName", `v: {{ podName .ObjectMeta }}`, []string{"podName"}},
		{"field chain", `v: {{ .ObjectMeta.Name }}`, []string{".ObjectMeta.Name"}},
		{"spec field", `v: {{ (index .Spec.Containers 0).Image }}`, []string{"index .Spec.Containers 0"}},
		{"index of labels", `v: {{ index .ObjectMeta.Labels "app" }}`, []string{"index .ObjectMeta.Labels"}},
		{"dollar root", `{{ with .Values }}v: {{ $.ObjectMeta.Name }}{{ end }}`, []string{"$.ObjectMeta.Name"}},
		{"whole root printed", `v: {{ . }}`, []string{"{{.}} prints"}},
		{"default of pod value", `v: {{ default "x" .ObjectMeta.Labels.app }}`, []string{"default"}},
		{"printf then quote", `v: {{ printf "a=%s" (annotation .ObjectMeta "k" "") | quote }}`, nil},
		{"quote then nindent", `v: {{ toYaml .ObjectMeta.Labels | nindent 2 }}`, nil},
		{"toJSON", `v: {{ toJSON .Spec.Containers }}`, nil},
		{"lower is not an escape", `v: {{ .ObjectMeta.Name | lower }}`, []string{"lower"}},
		{"safe function", `n: {{ len .Spec.Containers }} b: {{ .ObjectMeta.Name | b64enc }}`, nil},
		{"in a condition only", `{{ if eq .ObjectMeta.Name "a" }}v: 1{{ end }}`, nil},
		{"with binds dot", `{{ with annotation .ObjectMeta "k" "" }}v: {{ . }}{{ end }}`, []string{"{{.}} prints"}},
		{"with quoted", `{{ with annotation .ObjectMeta "k" "" }}v: {{ . | quote }}{{ end }}`, nil},
		{"with over values", `{{ with .Values.proxy }}v: {{ .image }}{{ end }}`, nil},
		{"with over metadata", `{{ with .ObjectMeta }}v: {{ .Name }}{{ end }}`, []string{".Name"}},
		{"with else is outer dot", `{{ with .Values.x }}{{ else }}v: {{ .Values.y }}{{ end }}`, nil},
		{"range over labels", `{{ range $k, $v := .ObjectMeta.Labels }}{{ $k }}: {{ $v | quote }}{{ end }}`, []string{"{{$k}} prints"}},
		{"range dot", `{{ range .Spec.Containers }}- {{ .Name }}{{ end }}`, []string{".Name"}},
		{"range over values", `{{ range .Values.ports }}- {{ . }}{{ end }}`, nil},
		{"variable", `{{ $n := .ObjectMeta.Name }}v: {{ $n }}`, []string{"{{$n}} prints"}},
		{"variable quoted", `{{ $n := .ObjectMeta.Name }}v: {{ $n | quote }}`, nil},
		{"variable reassigned clean", `{{ $n := .ObjectMeta.Name }}{{ $n = "x" }}v: {{ $n }}`, nil},
		{"clean variable", `{{ $n := .Values.n }}v: {{ $n }}`, nil},
		{"define with root", `{{ define "d" }}v: {{ .ObjectMeta.Name }}{{ end }}{{ template "d" . }}`, []string{"x:1:22: {{.ObjectMeta.Name}} prints"}},
		{"template with pod dot", `{{ define "d" }}v: {{ .Name }}{{ end }}{{ template "d" .ObjectMeta }}`, []string{"passes"}},
		{"comment", `{{/* {{ .ObjectMeta.Name }} */}}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm, err := template.New("x").Funcs(sidecar.FuncMap()).Parse(tc.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			got := unquotedPodValues(tm)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d warnings %q, want %d %q", len(got), got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d %q lacks %q", i, got[i], w)
				}
			}
		})
	}
}

func sampleFromConfig(t *testing.T) *v1alpha1.SidecarInjector {
	t.Helper()
	b, err := os.ReadFile("../../../config/samples/admission_v1alpha1_sidecarinjector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	si, err := sidecar.DecodeSidecarInjector(b)
	if err != nil {
		t.Fatal(err)
	}
	return si
}

// The shipped sample must be warning-free: every pod value in it is quoted.
func TestSampleTemplatesDoNotWarn(t *testing.T) {
	si := sampleFromConfig(t)
	if w := sidecarInjectorWarnings(si); len(w) != 0 {
		t.Fatalf("sample warns: %q", w)
	}
}

func TestSidecarInjectorWarnings(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"inject": "on"}}
	for _, tc := range []struct {
		name string
		fp   v1alpha1.FailurePolicy
		sel  *metav1.LabelSelector
		want int
	}{
		{"default policy, no selector", "", nil, 1},
		{"Fail, no selector", v1alpha1.FailurePolicyFail, nil, 1},
		{"Fail, selector", v1alpha1.FailurePolicyFail, sel, 0},
		{"Ignore, no selector", v1alpha1.FailurePolicyIgnore, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			si := &v1alpha1.SidecarInjector{Spec: v1alpha1.SidecarInjectorSpec{FailurePolicy: tc.fp, NamespaceSelector: tc.sel}}
			w := sidecarInjectorWarnings(si)
			if len(w) != tc.want || tc.want == 1 && !strings.Contains(w[0], "failurePolicy Fail") {
				t.Fatalf("warnings %q, want %d", w, tc.want)
			}
		})
	}
}

func TestRolloutWarnings(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	one := intstr.FromInt32(1)
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"canary": "yes"}}
	for _, tc := range []struct {
		name string
		r    v1alpha1.RolloutSpec
		want []string
	}{
		{"none", v1alpha1.RolloutSpec{}, nil},
		{"in place", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace, MaxUnavailable: &one}, nil},
		{"restart everything", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart}, []string{"restarts the owners of every matched pod"}},
		{"fallback everything", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace, FallbackToRestart: true}, []string{"restarts the owners"}},
		{"restart canary", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, Selector: sel}, nil},
		{"restart partition", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, Partition: pct("90%")}, nil},
		{"restart partition 0", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, Partition: pct("0%")}, []string{"restarts the owners"}},
		{"paused", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutRestart, Paused: true}, nil},
		{"wide", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace, MaxUnavailable: pct("50%")}, []string{"maxUnavailable 50%"}},
		{"quarter", v1alpha1.RolloutSpec{Strategy: v1alpha1.RolloutInPlace, MaxUnavailable: pct("25%")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := rolloutWarnings(&tc.r)
			if len(w) != len(tc.want) {
				t.Fatalf("warnings %q, want %q", w, tc.want)
			}
			for i := range w {
				if !strings.Contains(w[i], tc.want[i]) || len([]rune(w[i])) > maxWarningRunes {
					t.Fatalf("warning %q, want %q within %d runes", w[i], tc.want[i], maxWarningRunes)
				}
			}
		})
	}
}

func TestNodeOversellWarnings(t *testing.T) {
	pool := &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "x"}}
	for _, tc := range []struct {
		name   string
		ratios v1alpha1.OversellRatios
		sel    *metav1.LabelSelector
		fp     v1alpha1.FailurePolicy
		n      int
		want   []string
	}{
		{"cpu only", v1alpha1.OversellRatios{CPU: "2"}, pool, "", 0, nil},
		{"memory 1", v1alpha1.OversellRatios{CPU: "2", Memory: "1.000"}, pool, "", 0, nil},
		{"memory 1.5", v1alpha1.OversellRatios{Memory: "1.5"}, pool, "", 1, []string{"spec.ratios.memory 1.5 is above 1", "78580"}},
		{"memory 1.000001", v1alpha1.OversellRatios{Memory: "1.000001"}, pool, "", 1, []string{"1.000001"}},
		{"nil selector", v1alpha1.OversellRatios{CPU: "2"}, nil, "", 1, []string{"every node is oversold, control-plane"}},
		{"empty selector", v1alpha1.OversellRatios{CPU: "2"}, &metav1.LabelSelector{}, "", 1, []string{"spec.nodeSelector is empty"}},
		{"expression selector", v1alpha1.OversellRatios{CPU: "2"}, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: metav1.LabelSelectorOpExists}}}, "", 0, nil},
		{"both", v1alpha1.OversellRatios{Memory: "3"}, nil, "", 2, []string{"memory 3", "nodeSelector"}},
		{"stored with Fail", v1alpha1.OversellRatios{CPU: "2"}, pool, v1alpha1.FailurePolicyFail, 1, []string{"failurePolicy Fail", "set Ignore"}},
		{"Ignore", v1alpha1.OversellRatios{CPU: "2"}, pool, v1alpha1.FailurePolicyIgnore, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			no := &v1alpha1.NodeOversell{Spec: v1alpha1.NodeOversellSpec{Ratios: tc.ratios, NodeSelector: tc.sel, FailurePolicy: tc.fp}}
			p, err := oversell.CompilePolicy(no)
			if err != nil {
				t.Fatal(err)
			}
			w := nodeOversellWarnings(no, p)
			if len(w) != tc.n {
				t.Fatalf("warnings %q, want %q", w, tc.want)
			}
			joined := strings.Join(w, "\n")
			for _, s := range tc.want {
				if !strings.Contains(joined, s) {
					t.Errorf("warnings %q lack %q", w, s)
				}
			}
		})
	}
}

// Warnings reach the response, one line each and within the length the API
// server passes on; an error still wins over warnings.
func TestHandleReturnsWarnings(t *testing.T) {
	long := strings.Repeat("x", 300)
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "w"}, Spec: v1alpha1.SidecarInjectorSpec{
		Templates: []v1alpha1.NamedTemplate{{Name: "p", Template: "metadata:\n  labels:\n    a: {{ printf \"%s" + long + "\" .ObjectMeta.Name }}\n"}},
	}}
	r := review(t, admissionv1.Create, "SidecarInjector", si)
	if !r.Allowed || len(r.Warnings) != 2 {
		t.Fatalf("allowed=%t warnings %q", r.Allowed, r.Warnings)
	}
	for _, w := range r.Warnings {
		if utf8.RuneCountInString(w) > maxWarningRunes || strings.ContainsAny(w, "\n\r\t") {
			t.Errorf("warning not one short line: %q", w)
		}
	}
	if !strings.Contains(r.Warnings[1], "template p:3:10:") {
		t.Errorf("template warning %q lacks its location", r.Warnings[1])
	}
	si.Spec.Templates[0].Template = "{{ nosuch }}"
	if r := review(t, admissionv1.Create, "SidecarInjector", si); r.Allowed || len(r.Warnings) != 0 {
		t.Fatalf("invalid: allowed=%t warnings %q", r.Allowed, r.Warnings)
	}
	no := &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: v1alpha1.NodeOversellSpec{Ratios: v1alpha1.OversellRatios{Memory: "2"}}}
	if r := review(t, admissionv1.Create, "NodeOversell", no); !r.Allowed || len(r.Warnings) != 2 {
		t.Fatalf("NodeOversell: allowed=%t warnings %q", r.Allowed, r.Warnings)
	}
}

func TestServerWarnings(t *testing.T) {
	spread := func(w corev1.UnsatisfiableConstraintAction) []corev1.TopologySpreadConstraint {
		return []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: w}}
	}
	for _, tc := range []struct {
		name      string
		server    v1alpha1.ServerSpec
		defaultNS string
		want      []string // one substring per expected warning, in order
	}{
		{name: "none", defaultNS: "hookwright-system"},
		{name: "user class", server: v1alpha1.ServerSpec{PriorityClassName: "hookwright-servers"}, defaultNS: "hookwright-system"},
		{name: "cluster critical in the operator namespace", server: v1alpha1.ServerSpec{PriorityClassName: v1alpha1.PriorityClusterCritical},
			defaultNS: "hookwright-system", want: []string{"namespace hookwright-system needs a ResourceQuota with scopeSelector PriorityClass In [system-cluster-critical]"}},
		{name: "node critical in the CR's namespace", server: v1alpha1.ServerSpec{PriorityClassName: v1alpha1.PriorityNodeCritical, Namespace: "mesh-servers"},
			defaultNS: "hookwright-system", want: []string{"namespace mesh-servers needs a ResourceQuota with scopeSelector PriorityClass In [system-node-critical]"}},
		{name: "critical without a known namespace", server: v1alpha1.ServerSpec{PriorityClassName: v1alpha1.PriorityClusterCritical},
			want: []string{"the server namespace needs a ResourceQuota"}},
		{name: "critical in kube-system", server: v1alpha1.ServerSpec{PriorityClassName: v1alpha1.PriorityClusterCritical, Namespace: "kube-system"}},
		{name: "ScheduleAnyway spread", server: v1alpha1.ServerSpec{TopologySpreadConstraints: spread(corev1.ScheduleAnyway)}},
		{name: "DoNotSchedule spread", server: v1alpha1.ServerSpec{TopologySpreadConstraints: spread(corev1.DoNotSchedule)},
			want: []string{"topologySpreadConstraints[0] (topology.kubernetes.io/zone) is DoNotSchedule"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := serverWarnings(tc.server, tc.defaultNS)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d warnings %q, want %d", len(got), got, len(tc.want))
			}
			for i, w := range got {
				if !strings.Contains(w, tc.want[i]) {
					t.Errorf("warning %d %q lacks %q", i, w, tc.want[i])
				}
				if n := utf8.RuneCountInString(w); n > maxWarningRunes || strings.HasSuffix(w, "...") {
					t.Errorf("warning %d is %d runes or clipped: %q", i, n, w)
				}
			}
		})
	}
}
