package sidecar

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

func TestParseBool(t *testing.T) {
	for _, s := range []string{"true", "TRUE", "True", "y", "Y", "yes", "YES", "on", "On"} {
		if v, ok := ParseBool(s); !ok || !v {
			t.Errorf("ParseBool(%q) = %v, %v", s, v, ok)
		}
	}
	// The operator's objectSelector lists these as opt-outs: each must be one.
	for _, s := range append([]string{"fALSE", "oFf"}, v1alpha1.SidecarOptOutLabelValues...) {
		if v, ok := ParseBool(s); !ok || v {
			t.Errorf("ParseBool(%q) = %v, %v", s, v, ok)
		}
	}
	for _, s := range []string{"", "1", "0", "enabled", " true", "yes!", "t"} {
		if _, ok := ParseBool(s); ok {
			t.Errorf("ParseBool(%q) accepted", s)
		}
	}
}

func TestDecide(t *testing.T) {
	sel := func(k, v string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	base := v1alpha1.SidecarInjectorSpec{
		Policy:               v1alpha1.PolicyEnabled,
		NamespaceSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"sidecar-injection": "enabled"}},
		NeverInjectSelector:  []metav1.LabelSelector{sel("tier", "batch"), {}},
		AlwaysInjectSelector: []metav1.LabelSelector{sel("mesh", "always"), sel("tier", "batch")},
		Server:               v1alpha1.ServerSpec{Namespace: "injector-ns"},
	}
	type pod struct {
		labels, annotations map[string]string
		hostNetwork         bool
		containers          []string
	}
	cases := []struct {
		name     string
		mutate   func(*v1alpha1.SidecarInjectorSpec)
		ns       string
		nsLabels map[string]string
		pod      pod
		inject   bool
		code     Code
		warn     string
	}{
		{name: "policy enabled", ns: "shop", inject: true, code: CodePolicy},
		{name: "policy disabled", mutate: func(s *v1alpha1.SidecarInjectorSpec) { s.Policy = v1alpha1.PolicyDisabled }, ns: "shop", code: CodePolicy},
		{name: "empty policy defaults to enabled", mutate: func(s *v1alpha1.SidecarInjectorSpec) { s.Policy = "" }, ns: "shop", inject: true, code: CodePolicy},
		{name: "already injected", ns: "shop", pod: pod{annotations: map[string]string{v1alpha1.SidecarStatusKey: "{}"}}, code: CodeAlreadyInjected},
		{name: "status with its containers", ns: "shop", pod: pod{annotations: map[string]string{v1alpha1.SidecarStatusKey: `{"injector":"t","initContainers":["init"],"containers":["proxy"]}`},
			containers: []string{"init", "app", "proxy"}}, code: CodeAlreadyInjected},
		{name: "status naming absent containers", ns: "shop", pod: pod{annotations: map[string]string{v1alpha1.SidecarStatusKey: `{"injector":"t","initContainers":["init"],"containers":["proxy"]}`},
			containers: []string{"init", "app"}}, inject: true, code: CodePolicy, warn: "names containers the pod lacks (proxy): injecting again"},
		{name: "another injector's stale status", ns: "shop", pod: pod{annotations: map[string]string{v1alpha1.SidecarStatusKey: `{"injector":"other","containers":["log"]}`},
			containers: []string{"app"}}, inject: true, code: CodePolicy, warn: "(log)"},
		{name: "another injector's status", ns: "shop", pod: pod{annotations: map[string]string{v1alpha1.SidecarStatusKey: `{"injector":"other","containers":["log"]}`},
			containers: []string{"app", "log"}}, code: CodeInjectedByOther},
		{name: "another injector's status, a field of another type", ns: "shop", pod: pod{annotations: map[string]string{v1alpha1.SidecarStatusKey: `{"injector":"other","containers":"log"}`},
			containers: []string{"app"}}, code: CodeInjectedByOther},
		{name: "status that is not JSON", ns: "shop", pod: pod{annotations: map[string]string{v1alpha1.SidecarStatusKey: `injector=other`}}, code: CodeAlreadyInjected},
		{name: "stale status, opted out", ns: "shop", pod: pod{labels: map[string]string{v1alpha1.SidecarInjectKey: "false"}, annotations: map[string]string{v1alpha1.SidecarStatusKey: `{"containers":["proxy"]}`}},
			code: CodeLabel, warn: "names containers the pod lacks"},
		{name: "kube-system", ns: "kube-system", pod: pod{labels: map[string]string{v1alpha1.SidecarInjectKey: "true"}}, code: CodeSystemNamespace},
		{name: "kube-public", ns: "kube-public", code: CodeSystemNamespace},
		{name: "kube-node-lease", ns: "kube-node-lease", code: CodeSystemNamespace},
		{name: "operator namespace", ns: "hookwright-system", pod: pod{labels: map[string]string{v1alpha1.SidecarInjectKey: "true"}}, code: CodeOperatorNamespace},
		{name: "injector server namespace", ns: "injector-ns", code: CodeOperatorNamespace},
		{name: "another allowed server namespace (Params.ExcludedNamespaces)", ns: "edge-servers", pod: pod{labels: map[string]string{v1alpha1.SidecarInjectKey: "true"}}, code: CodeOperatorNamespace},
		{name: "namespace labels match", ns: "shop", nsLabels: map[string]string{"sidecar-injection": "enabled"}, inject: true, code: CodePolicy},
		{name: "namespace labels do not match", ns: "shop", nsLabels: map[string]string{}, code: CodeNamespaceSelector},
		{name: "object selector", mutate: func(s *v1alpha1.SidecarInjectorSpec) {
			s.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"mesh": "on"}}
		}, ns: "shop", code: CodeObjectSelector},
		{name: "hostNetwork skipped even when opted in", ns: "shop", pod: pod{hostNetwork: true, labels: map[string]string{v1alpha1.SidecarInjectKey: "true"}}, code: CodeHostNetwork},
		{name: "hostNetwork allowed", mutate: func(s *v1alpha1.SidecarInjectorSpec) { s.InjectHostNetwork = true }, ns: "shop", pod: pod{hostNetwork: true}, inject: true, code: CodePolicy},
		{name: "label true", mutate: func(s *v1alpha1.SidecarInjectorSpec) { s.Policy = v1alpha1.PolicyDisabled }, ns: "shop",
			pod: pod{labels: map[string]string{v1alpha1.SidecarInjectKey: "TRUE"}}, inject: true, code: CodeLabel},
		{name: "label wins over annotation", ns: "shop",
			pod: pod{labels: map[string]string{v1alpha1.SidecarInjectKey: "off"}, annotations: map[string]string{v1alpha1.SidecarInjectKey: "yes"}}, code: CodeLabel},
		{name: "invalid label ignored, annotation decides", ns: "shop",
			pod:  pod{labels: map[string]string{v1alpha1.SidecarInjectKey: "maybe"}, annotations: map[string]string{v1alpha1.SidecarInjectKey: "N"}},
			code: CodeAnnotation, warn: `ignored label sidecar.hookwright.io/inject="maybe"`},
		{name: "invalid annotation ignored, policy decides", ns: "shop",
			pod:    pod{annotations: map[string]string{v1alpha1.SidecarInjectKey: "enabled"}},
			inject: true, code: CodePolicy, warn: `ignored annotation sidecar.hookwright.io/inject="enabled"`},
		{name: "annotation y", mutate: func(s *v1alpha1.SidecarInjectorSpec) { s.Policy = v1alpha1.PolicyDisabled }, ns: "shop",
			pod: pod{annotations: map[string]string{v1alpha1.SidecarInjectKey: "y"}}, inject: true, code: CodeAnnotation},
		{name: "explicit opt-in beats neverInjectSelector", ns: "shop",
			pod: pod{labels: map[string]string{"tier": "batch", v1alpha1.SidecarInjectKey: "on"}}, inject: true, code: CodeLabel},
		{name: "neverInjectSelector wins over alwaysInjectSelector", ns: "shop",
			pod: pod{labels: map[string]string{"tier": "batch"}}, code: CodeNeverInjectSelector},
		{name: "alwaysInjectSelector beats disabled policy", mutate: func(s *v1alpha1.SidecarInjectorSpec) { s.Policy = v1alpha1.PolicyDisabled }, ns: "shop",
			pod: pod{labels: map[string]string{"mesh": "always"}}, inject: true, code: CodeAlwaysInjectSelector},
		{name: "explicit opt-out beats alwaysInjectSelector", ns: "shop",
			pod: pod{labels: map[string]string{"mesh": "always"}, annotations: map[string]string{v1alpha1.SidecarInjectKey: "false"}}, code: CodeAnnotation},
		{name: "empty neverInjectSelector matches nothing", ns: "shop", pod: pod{labels: map[string]string{"x": "y"}}, inject: true, code: CodePolicy},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := *base.DeepCopy()
			if tc.mutate != nil {
				tc.mutate(&spec)
			}
			cfg, err := Compile(&v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: tc.pod.labels, Annotations: tc.pod.annotations}}
			p.Spec.HostNetwork = tc.pod.hostNetwork
			for _, c := range tc.pod.containers {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
			}
			params := testParams
			params.ExcludedNamespaces = []string{"edge-servers"}
			d := Decide(cfg, params, DecideInput{Pod: p, Namespace: tc.ns, NamespaceLabels: tc.nsLabels})
			// The fleet's config without templates decides the same.
			if od := Decide(cfg.ForDecisions(), params, DecideInput{Pod: p, Namespace: tc.ns, NamespaceLabels: tc.nsLabels}); !reflect.DeepEqual(od, d) {
				t.Errorf("ForDecisions decided %+v, the full config %+v", od, d)
			}
			if d.Inject != tc.inject || d.Code != tc.code {
				t.Fatalf("got inject=%v code=%s (%s), want inject=%v code=%s", d.Inject, d.Code, d.Reason, tc.inject, tc.code)
			}
			if d.Reason == "" {
				t.Error("empty reason")
			}
			if tc.warn == "" && len(d.Warnings) > 0 {
				t.Errorf("unexpected warnings %q", d.Warnings)
			}
			if tc.warn != "" && (len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], tc.warn)) {
				t.Errorf("warnings %q, want one containing %q", d.Warnings, tc.warn)
			}
		})
	}
}

func TestNativeDefault(t *testing.T) {
	cases := []struct {
		mode    v1alpha1.NativeSidecarMode
		version string
		want    bool
	}{
		{v1alpha1.NativeSidecarAuto, "v1.28.9", false},
		{v1alpha1.NativeSidecarAuto, "v1.29.0", true},
		{v1alpha1.NativeSidecarAuto, "v1.33.1-gke.100", true},
		{v1alpha1.NativeSidecarAuto, "", false},
		{v1alpha1.NativeSidecarAuto, "garbage", false},
		{"", "v1.30.0", true},
		{v1alpha1.NativeSidecarEnabled, "v1.27.0", true},
		{v1alpha1.NativeSidecarDisabled, "v1.33.0", false},
	}
	for _, c := range cases {
		if got := nativeDefault(c.mode, c.version); got != c.want {
			t.Errorf("NativeDefault(%q, %q) = %v", c.mode, c.version, got)
		}
	}
}

// TestCompileRejects: configs the CRD schema cannot fully check (selector
// operators are metav1.LabelSelector's, not ours) or that come from a
// --config file fail at compile time with a message naming the field.
func TestCompileRejects(t *testing.T) {
	badOp := []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Equals", Values: []string{"x"}}}
	cases := []struct {
		name string
		edit func(*v1alpha1.SidecarInjectorSpec)
		want string
	}{
		{"duplicate default", func(s *v1alpha1.SidecarInjectorSpec) { s.DefaultTemplates = []string{"proxy", "logging", "proxy"} },
			`spec.defaultTemplates: "proxy" listed twice`},
		{"namespaceSelector operator", func(s *v1alpha1.SidecarInjectorSpec) {
			s.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: badOp}
		}, `spec.namespaceSelector: "Equals" is not a valid label selector operator`},
		{"objectSelector operator", func(s *v1alpha1.SidecarInjectorSpec) {
			s.ObjectSelector = &metav1.LabelSelector{MatchExpressions: badOp}
		}, `spec.objectSelector: "Equals" is not a valid label selector operator`},
		{"neverInjectSelector operator", func(s *v1alpha1.SidecarInjectorSpec) {
			s.NeverInjectSelector = []metav1.LabelSelector{{}, {MatchExpressions: badOp}}
		}, `spec.neverInjectSelector[1]: "Equals" is not a valid label selector operator`},
		{"alwaysInjectSelector operator", func(s *v1alpha1.SidecarInjectorSpec) {
			s.AlwaysInjectSelector = []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}}}}}
		}, `spec.alwaysInjectSelector[0]:`},
	}
	for _, c := range cases {
		cr := sampleCR(t)
		c.edit(&cr.Spec)
		_, err := Compile(cr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestNamespaceKeyDecidesAlike: for every pod, two namespaces with the
// same KeyOfNamespace get the same Inject and Code from Decide, whatever
// their names and labels; the fleet's memo relies on it.
func TestNamespaceKeyDecidesAlike(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	specs := map[string]v1alpha1.SidecarInjectorSpec{
		"no selector": {Policy: v1alpha1.PolicyEnabled, Server: v1alpha1.ServerSpec{Namespace: "mesh-servers"}},
		"selector": {Policy: v1alpha1.PolicyEnabled, NamespaceSelector: sel, Server: v1alpha1.ServerSpec{Namespace: "mesh-servers"},
			NeverInjectSelector: []metav1.LabelSelector{{MatchLabels: map[string]string{"role": "db"}}}},
		"disabled": {Policy: v1alpha1.PolicyDisabled, NamespaceSelector: sel, Server: v1alpha1.ServerSpec{Namespace: "mesh-servers"},
			AlwaysInjectSelector: []metav1.LabelSelector{{MatchLabels: map[string]string{"mesh": "always"}}}},
	}
	params := testParams
	params.OperatorNamespace = "hookwright-system"
	params.ExcludedNamespaces = []string{"edge", "calico-system"}
	params.SparedNamespaces = []string{"calico-system"}
	type ns struct {
		name   string
		labels map[string]string
	}
	nss := []ns{{"", nil}, {"kube-system", map[string]string{"team": "a"}}, {"hookwright-system", nil}, {"mesh-servers", map[string]string{"team": "a"}},
		{"edge", map[string]string{"team": "a"}}, {"calico-system", map[string]string{"team": "a"}}}
	for i := range 4 {
		n := fmt.Sprintf("apps-%d", i)
		nss = append(nss, ns{n, map[string]string{"team": "a", "kubernetes.io/metadata.name": n}},
			ns{n + "-b", map[string]string{"team": "b", "kubernetes.io/metadata.name": n + "-b"}}, ns{n + "-unknown", nil}, ns{n + "-none", map[string]string{}})
	}
	pods := []*corev1.Pod{
		{},
		{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.SidecarInjectKey: "true"}}},
		{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1alpha1.SidecarInjectKey: "false", "mesh": "always"}}},
		{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"role": "db", "mesh": "always"}}},
		{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.MirrorPodAnnotation: "x"}}},
		{Spec: corev1.PodSpec{PriorityClassName: v1alpha1.PriorityNodeCritical}},
		{Spec: corev1.PodSpec{HostNetwork: true}},
		{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.SidecarStatusKey: `{"injector":"other"}`}}},
	}
	for name, spec := range specs {
		cfg, err := Compile(&v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[NamespaceKey]ns{}
		for _, n := range nss {
			k := KeyOfNamespace(cfg, params, n.name, n.labels)
			first, ok := seen[k]
			if !ok {
				seen[k] = n
				continue
			}
			for i, pod := range pods {
				a := Decide(cfg, params, DecideInput{Pod: pod, Namespace: first.name, NamespaceLabels: first.labels})
				b := Decide(cfg, params, DecideInput{Pod: pod, Namespace: n.name, NamespaceLabels: n.labels})
				if a.Inject != b.Inject || a.Code != b.Code {
					t.Errorf("%s, pod %d: namespaces %q and %q share key %+v but decide %v/%s and %v/%s", name, i, first.name, n.name, k, a.Inject, a.Code, b.Inject, b.Code)
				}
			}
		}
		// Four name-keyed namespaces plus pass and fail, whatever the number
		// of plain namespaces.
		if name != "no selector" && len(seen) != 7 {
			t.Errorf("%s: %d keys for %d namespaces, want 7: %v", name, len(seen), len(nss), seen)
		}
	}
}
