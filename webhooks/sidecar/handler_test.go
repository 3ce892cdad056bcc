package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

const nginxPod = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"nginx","namespace":"shop","labels":{"app":"nginx"}},"spec":{"containers":[{"name":"nginx","image":"nginx:1.27","ports":[{"containerPort":80}]}]}}`

func decodeReview(t *testing.T, rec *httptest.ResponseRecorder) *admissionv1.AdmissionResponse {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.APIVersion != "admission.k8s.io/v1" || r.Kind != "AdmissionReview" || r.Response == nil {
		t.Fatalf("bad review %s", rec.Body)
	}
	return r.Response
}

func TestHandlerBadInput(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	good := reviewFor(t, []byte(nginxPod), "shop", false)
	big := bytes.Repeat([]byte(" "), maxBodyBytes+1)
	cases := []struct {
		name        string
		method      string
		body        []byte
		contentType string
		code        int
		msg         string
	}{
		{"GET", http.MethodGet, nil, "application/json", http.StatusMethodNotAllowed, "POST"},
		{"no content type", "", good, "", http.StatusUnsupportedMediaType, "application/json"},
		{"wrong content type", "", good, "text/yaml", http.StatusUnsupportedMediaType, "text/yaml"},
		{"non-JSON", "", []byte("apiVersion: v1\nkind: Pod\n"), "application/json", http.StatusBadRequest, "not a JSON AdmissionReview"},
		{"truncated", "", good[:len(good)/2], "application/json", http.StatusBadRequest, "not a JSON AdmissionReview"},
		{"empty", "", nil, "application/json", http.StatusBadRequest, "not a JSON AdmissionReview"},
		{"too large", "", big, "application/json", http.StatusRequestEntityTooLarge, "limit"},
		{"v1beta1", "", bytes.Replace(good, []byte("admission.k8s.io/v1"), []byte("admission.k8s.io/v1beta1"), 1), "application/json", http.StatusBadRequest, "want admission.k8s.io/v1"},
		{"no request", "", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), "application/json", http.StatusBadRequest, "no request"},
		{"JSON array", "", []byte(`[1,2]`), "application/json", http.StatusBadRequest, "not a JSON AdmissionReview"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req := httptest.NewRequest(method, "/inject", bytes.NewReader(tc.body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.msg) {
				t.Fatalf("got %d %q, want %d containing %q", rec.Code, rec.Body.String(), tc.code, tc.msg)
			}
		})
	}
	t.Run("content length over limit", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodPost, "/inject", bytes.NewReader(good))
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = maxBodyBytes + 1
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("got %d", rec.Code)
		}
	})
	t.Run("charset parameter accepted", func(t *testing.T) {
		resp := decodeReview(t, serve(h, good, "application/json; charset=utf-8"))
		if !resp.Allowed || len(resp.Patch) == 0 {
			t.Fatalf("%+v", resp)
		}
	})
}

func TestHandlerDenials(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	mk := func(mut func(*admissionv1.AdmissionReview)) []byte {
		var r admissionv1.AdmissionReview
		if err := json.Unmarshal(reviewFor(t, []byte(nginxPod), "shop", false), &r); err != nil {
			t.Fatal(err)
		}
		mut(&r)
		b, _ := json.Marshal(r)
		return b
	}
	cases := []struct {
		name string
		body []byte
		msg  string
	}{
		{"wrong kind", mk(func(r *admissionv1.AdmissionReview) { r.Request.Kind.Kind = "ConfigMap" }), "expected a v1 pods request"},
		{"wrong resource", mk(func(r *admissionv1.AdmissionReview) { r.Request.Resource.Resource = "configmaps" }), "expected a v1 pods request"},
		{"subresource", mk(func(r *admissionv1.AdmissionReview) { r.Request.SubResource = "ephemeralcontainers" }), "subresource"},
		{"apps group", mk(func(r *admissionv1.AdmissionReview) { r.Request.Kind.Group = "apps" }), "expected a v1 pods request"},
		{"undecodable pod", mk(func(r *admissionv1.AdmissionReview) { r.Request.Object.Raw = []byte(`{"spec":{"containers":"nope"}}`) }), "cannot decode pod"},
		{"pod is not an object", mk(func(r *admissionv1.AdmissionReview) { r.Request.Object.Raw = []byte(`"pod"`) }), "cannot decode pod"},
		{"no object", mk(func(r *admissionv1.AdmissionReview) { r.Request.Object.Raw = nil }), "cannot decode pod"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := decodeReview(t, serve(h, tc.body, "application/json"))
			if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, tc.msg) {
				t.Fatalf("got %+v, want denial containing %q", resp, tc.msg)
			}
			if resp.UID == "" {
				t.Error("response without uid")
			}
		})
	}
	t.Run("update is allowed untouched with a warning", func(t *testing.T) {
		resp := decodeReview(t, serve(h, mk(func(r *admissionv1.AdmissionReview) { r.Request.Operation = admissionv1.Update }), "application/json"))
		if !resp.Allowed || len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "UPDATE") {
			t.Fatalf("%+v", resp)
		}
	})
}

func TestHandlerNoConfig(t *testing.T) {
	h := newTestHandler(t, nil)
	rec := serve(h, reviewFor(t, []byte(nginxPod), "shop", false), "application/json")
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("got %d", rec.Code)
	}
}

func TestHandlerInjectAndMetrics(t *testing.T) {
	cfg := sampleConfig(t)
	h := newTestHandler(t, cfg)
	before := testutil.ToFloat64(h.Metrics.injections.WithLabelValues(cfg.Name, string(CodePolicy)))
	resp := decodeReview(t, serve(h, reviewFor(t, []byte(nginxPod), "shop", false), "application/json"))
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch || len(resp.Patch) == 0 {
		t.Fatalf("%+v", resp)
	}
	if got := testutil.ToFloat64(h.Metrics.injections.WithLabelValues(cfg.Name, string(CodePolicy))); got != before+1 {
		t.Errorf("injections counter %v, want %v", got, before+1)
	}
	if testutil.CollectAndCount(h.Metrics.duration) == 0 {
		t.Error("no latency observed")
	}
}

// TestHandlerDryRunIdentical: dry-run is never read, and for a pod without
// user overrides the patch is built in a fixed order, so the answers are
// byte-identical.
func TestHandlerDryRunIdentical(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	for _, pod := range []string{nginxPod, string(goldenPodJSON(t, "pod-foreign-init.yaml")), string(goldenPodJSON(t, "pod-user-proxy.yaml"))} {
		wet := serve(h, reviewFor(t, []byte(pod), "shop", false), "application/json")
		dry := serve(h, reviewFor(t, []byte(pod), "shop", true), "application/json")
		w, d := decodeReview(t, wet), decodeReview(t, dry)
		if !w.Allowed || !d.Allowed || !patchesEquivalent(t, []byte(pod), w.Patch, d.Patch) {
			t.Fatalf("dry-run answer differs:\n%s\n%s", w.Patch, d.Patch)
		}
		if !strings.Contains(pod, `"name":"proxy"`) && !bytes.Equal(wet.Body.Bytes(), dry.Body.Bytes()) {
			t.Errorf("dry-run answer not byte-identical:\n%s\n%s", wet.Body, dry.Body)
		}
	}
}

func patchesEquivalent(t *testing.T, doc, a, b []byte) bool {
	t.Helper()
	return jsonEqual(t, applyPatch(t, doc, a), applyPatch(t, doc, b))
}

func TestHandlerSkipWarnings(t *testing.T) {
	cfg := sampleConfig(t)
	h := newTestHandler(t, cfg)
	before := testutil.ToFloat64(h.Metrics.skips.WithLabelValues(cfg.Name, string(CodeLabel)))
	pod := `{"metadata":{"generateName":"web-","labels":{"sidecar.hookwright.io/inject":"no"}},"spec":{"containers":[{"name":"a","image":"a"}]}}`
	resp := decodeReview(t, serve(h, reviewFor(t, []byte(pod), "shop", false), "application/json"))
	if !resp.Allowed || len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "not injected: label") {
		t.Fatalf("%+v", resp)
	}
	if got := testutil.ToFloat64(h.Metrics.skips.WithLabelValues(cfg.Name, string(CodeLabel))); got != before+1 {
		t.Errorf("skips counter %v", got)
	}
	// An ignored value is warned about, and injection goes on by policy.
	pod = `{"metadata":{"name":"web","annotations":{"sidecar.hookwright.io/inject":"sure"}},"spec":{"containers":[{"name":"a","image":"a"}]}}`
	resp = decodeReview(t, serve(h, reviewFor(t, []byte(pod), "shop", false), "application/json"))
	if !resp.Allowed || len(resp.Patch) == 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], `ignored annotation sidecar.hookwright.io/inject="sure"`) {
		t.Fatalf("%+v", resp)
	}
}

func TestHandlerRenderFailure(t *testing.T) {
	cr := sampleCR(t)
	cr.Spec.Templates = append(cr.Spec.Templates, v1alpha1.NamedTemplate{Name: "fragile",
		Template: `{{ if eq (label .ObjectMeta "app" "") "boom" }}{{ fail "app boom is not supported" }}{{ end }}spec: {}`})
	pod := []byte(`{"metadata":{"name":"b","labels":{"app":"boom"},"annotations":{"sidecar.hookwright.io/templates":"proxy,fragile"}},"spec":{"containers":[{"name":"a","image":"a"}]}}`)
	unknown := []byte(`{"metadata":{"name":"b","annotations":{"sidecar.hookwright.io/templates":"nope"}},"spec":{"containers":[{"name":"a","image":"a"}]}}`)
	for _, fp := range []v1alpha1.FailurePolicy{v1alpha1.FailurePolicyFail, v1alpha1.FailurePolicyIgnore} {
		cr.Spec.FailurePolicy = fp
		cfg, err := Compile(cr)
		if err != nil {
			t.Fatal(err)
		}
		h := newTestHandler(t, cfg)
		// A template that fails is the injector's fault (500); a pod naming
		// a template that does not exist is the pod's (400).
		for _, p := range []struct {
			pod  []byte
			want string
			code int32
		}{{pod, `template "fragile"`, http.StatusInternalServerError}, {unknown, `template "nope"`, http.StatusBadRequest}} {
			resp := decodeReview(t, serve(h, reviewFor(t, p.pod, "shop", false), "application/json"))
			switch fp {
			case v1alpha1.FailurePolicyFail:
				if resp.Allowed || !strings.Contains(resp.Result.Message, p.want) || resp.Result.Code != p.code {
					t.Errorf("Fail: %+v", resp)
				}
			default:
				if !resp.Allowed || len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], p.want) {
					t.Errorf("Ignore: %+v", resp)
				}
			}
		}
	}
}

func TestConfigz(t *testing.T) {
	s := &Store{}
	rec := httptest.NewRecorder()
	s.ConfigzHandler("sidecar-injector").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/configz", nil))
	var z Configz
	if err := json.Unmarshal(rec.Body.Bytes(), &z); err != nil || z.Loaded {
		t.Fatalf("%s %v", rec.Body, err)
	}
	cr := sampleCR(t)
	cr.Generation = 7
	if _, err := s.update(cr); err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	s.ConfigzHandler("sidecar-injector").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/configz", nil))
	if err := json.Unmarshal(rec.Body.Bytes(), &z); err != nil || !z.Loaded || z.Generation != 7 || z.Hash == "" {
		t.Fatalf("%s %v", rec.Body, err)
	}
}

func TestStoreKeepsLastGoodConfig(t *testing.T) {
	var swapped []int64
	s := &Store{OnChange: func(c *Config) { swapped = append(swapped, c.Generation) }}
	if s.Load() != nil {
		t.Fatal("config before first update")
	}
	cr := sampleCR(t)
	cr.Generation = 1
	if _, err := s.update(cr); err != nil {
		t.Fatal(err)
	}
	bad := []func(*v1alpha1.SidecarInjector){
		func(c *v1alpha1.SidecarInjector) { c.Spec.Templates[0].Template = "{{ .Nope" },
		func(c *v1alpha1.SidecarInjector) { c.Spec.Templates[0].Template = "spec: [unclosed" },
		func(c *v1alpha1.SidecarInjector) { c.Spec.Templates[0].Template = "kind: Pod\nspec: {}" },
		func(c *v1alpha1.SidecarInjector) { c.Spec.Templates[0].Template = "metadata:\n  name: x" },
		func(c *v1alpha1.SidecarInjector) { c.Spec.Templates[0].Template = "spec:\n  containers: 3" },
		func(c *v1alpha1.SidecarInjector) { c.Spec.Templates[0].Template = "{{ nosuchfunc }}" },
		func(c *v1alpha1.SidecarInjector) { c.Spec.DefaultTemplates = []string{"missing"} },
		func(c *v1alpha1.SidecarInjector) {
			c.Spec.NeverInjectSelector = []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}}
		},
		func(c *v1alpha1.SidecarInjector) { c.Spec.Values.Raw = []byte(`[1]`) },
		func(c *v1alpha1.SidecarInjector) { c.Spec.Policy = "Sometimes" },
	}
	for i, mut := range bad {
		c := sampleCR(t)
		c.Generation = int64(10 + i)
		mut(c)
		if _, err := s.update(c); err == nil {
			t.Errorf("bad config %d compiled", i)
		}
		if g := s.Load().Generation; g != 1 {
			t.Fatalf("bad config %d replaced the good one (serving %d)", i, g)
		}
		if s.lastError() == nil {
			t.Errorf("bad config %d: no LastError", i)
		}
	}
	cr.Generation = 2
	if _, err := s.update(cr); err != nil || s.Load().Generation != 2 || s.lastError() != nil {
		t.Fatalf("good update: %v", err)
	}
	if len(swapped) != 2 {
		t.Errorf("OnChange calls %v", swapped)
	}
}

// TestTemplatesAnnotationBounded: a huge templates annotation is parsed in
// one pass; duplicates collapse (with a warning) and too many or invalid
// names are a render failure, so failurePolicy decides (deny or admit
// unpatched with a warning).
func TestTemplatesAnnotationBounded(t *testing.T) {
	podWith := func(v string) []byte {
		b, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"name": "p", "annotations": map[string]string{v1alpha1.SidecarTemplatesKey: v}},
			"spec":     map[string]any{"containers": []any{map[string]string{"name": "a", "image": "a"}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cfg := sampleConfig(t)
	h := newTestHandler(t, cfg)

	// 40,000 repetitions inject once, like "proxy".
	resp := admit(t, h, podWith(strings.Repeat("proxy,", 40000)), "shop")
	plain := admit(t, h, podWith("proxy"), "shop")
	if !resp.Allowed || string(resp.Patch) != string(plain.Patch) {
		t.Fatalf("repeated proxy: allowed %t, patch %d bytes, want the %d of a single proxy", resp.Allowed, len(resp.Patch), len(plain.Patch))
	}
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "ignored 39999 duplicate name(s)") {
		t.Errorf("warnings %q", resp.Warnings)
	}
	// Order of first occurrence is kept.
	res, err := Inject(cfg, testParams, Input{Raw: podWith(" logging , proxy,logging,,proxy "), Namespace: "shop"})
	if err != nil || !slices.Equal(res.Templates, []string{"logging", "proxy"}) {
		t.Fatalf("templates %v, err %v", res.Templates, err)
	}

	var many []string
	for i := range maxTemplateNames + 1 {
		many = append(many, fmt.Sprintf("t%d", i))
	}
	bad := []struct{ value, want string }{
		{strings.Join(many, ","), "more than 32 distinct template names"},
		{"proxy," + strings.Repeat("x", 40000), "invalid template name"},
		{"proxy,Logging", `invalid template name "Logging"`},
		{"proxy,{{.}}", "invalid template name"},
	}
	for _, fp := range []v1alpha1.FailurePolicy{v1alpha1.FailurePolicyFail, v1alpha1.FailurePolicyIgnore} {
		cr := sampleCR(t)
		cr.Spec.FailurePolicy = fp
		cfg, err := Compile(cr)
		if err != nil {
			t.Fatal(err)
		}
		h := newTestHandler(t, cfg)
		for _, b := range bad {
			resp := admit(t, h, podWith(b.value), "shop")
			if fp == v1alpha1.FailurePolicyFail {
				if resp.Allowed || !strings.Contains(resp.Result.Message, b.want) || len(resp.Result.Message) > 300 {
					t.Errorf("Fail %.40q: %+v", b.value, resp)
				}
				continue
			}
			if !resp.Allowed || len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], b.want) {
				t.Errorf("Ignore %.40q: %+v", b.value, resp)
			}
		}
	}
}

// TestReviewCanceled: a request the API server abandoned renders nothing.
func TestReviewCanceled(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(reviewFor(t, []byte(`{"metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"a"}]}}`), "shop", false), &review); err != nil {
		t.Fatal(err)
	}
	resp := h.reviewContext(ctx, h.Store.Load(), review.Request)
	if resp.Allowed || resp.Result == nil || resp.Result.Reason != failCanceled || len(resp.Patch) != 0 {
		t.Fatalf("%+v", resp)
	}
}

// TestInjectedByOtherInjector: a pod injected by one SidecarInjector is left
// alone by a second one, which says so in a warning naming the first; the
// same injector seeing its own pod again (reinvocation) stays silent.
func TestInjectedByOtherInjector(t *testing.T) {
	first := sampleConfig(t)
	cr := sampleCR(t)
	cr.Name = "logging-injector"
	second, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Inject(first, testParams, Input{Raw: []byte(nginxPod), Namespace: "shop", WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatal(res, err)
	}
	resp := admit(t, newTestHandler(t, second), res.JSON, "shop")
	if !resp.Allowed || len(resp.Patch) != 0 || len(resp.Warnings) != 1 ||
		!strings.Contains(resp.Warnings[0], `logging-injector: not injected: pod already injected by SidecarInjector "sidecar-injector"`) {
		t.Errorf("second injector: %+v", resp)
	}
	resp = admit(t, newTestHandler(t, first), res.JSON, "shop")
	if !resp.Allowed || len(resp.Patch) != 0 || len(resp.Warnings) != 0 {
		t.Errorf("same injector again: %+v", resp)
	}

	// check-inject reports it per injector.
	var obj map[string]any
	if err := json.Unmarshal(res.JSON, &obj); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := CheckPods(&out, []*Config{first, second}, testParams, FindPods(obj, "shop"), func(string) map[string]string { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"sidecar-injector: would NOT inject [AlreadyInjected]",
		`logging-injector: would NOT inject [InjectedByOther]: pod already injected by SidecarInjector "sidecar-injector"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check-inject lacks %q:\n%s", want, out.String())
		}
	}
}
