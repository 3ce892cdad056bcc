package oversell

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
)

func post(h http.Handler, body []byte, contentType string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/oversell", bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// decodeResponse parses the handler's answer with the real API types.
func decodeResponse(t *testing.T, w *httptest.ResponseRecorder) *admissionv1.AdmissionResponse {
	t.Helper()
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	var rv admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &rv); err != nil {
		t.Fatalf("response %s: %v", w.Body, err)
	}
	if rv.APIVersion != "admission.k8s.io/v1" || rv.Kind != "AdmissionReview" || rv.Response == nil {
		t.Fatalf("bad response envelope %s", w.Body)
	}
	if rv.Response.UID != "0d3c6e1a-8b2f-4a7d-9c1e-5f6a7b8c9d0e" || !rv.Response.Allowed {
		t.Fatalf("uid %q allowed %v", rv.Response.UID, rv.Response.Allowed)
	}
	return rv.Response
}

// patchedNode applies the response patch to obj as the API server would.
func patchedNode(t *testing.T, obj *corev1.Node, resp *admissionv1.AdmissionResponse) *corev1.Node {
	t.Helper()
	raw, _ := json.Marshal(obj)
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v", resp.PatchType)
	}
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	if err := json.Unmarshal(out, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

func TestHandlerKubeletHeartbeatAmplifies(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	old := realisticNode("n1", "7600m", "30Gi", nil)
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	resp := decodeResponse(t, post(h, reviewFor(t, "system:node:n1", kubeletGroups, obj, old), "application/json"))
	if len(resp.Warnings) != 0 {
		t.Fatalf("warnings %v", resp.Warnings)
	}
	got := patchedNode(t, obj, resp)
	if q := got.Status.Allocatable["cpu"]; q.String() != "15200m" {
		t.Errorf("cpu %s", q.String())
	}
	if q := got.Status.Allocatable["memory"]; q.String() != "45Gi" {
		t.Errorf("memory %s", q.String())
	}
	for k, v := range obj.Status.Capacity {
		if q := got.Status.Capacity[k]; q.Cmp(v) != 0 {
			t.Errorf("capacity %s changed", k)
		}
	}
	for _, k := range []corev1.ResourceName{"pods", "ephemeral-storage", "hugepages-2Mi"} {
		if a, b := got.Status.Allocatable[k], obj.Status.Allocatable[k]; a.Cmp(b) != 0 {
			t.Errorf("allocatable %s changed", k)
		}
	}
	if got.Annotations[annRaw] != `{"cpu":"7600m","memory":"30Gi"}` || got.Annotations[annApplied] != "oversell-pool" {
		t.Errorf("annotations %v", got.Annotations)
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomePatched, "kubelet", string(reasonKubeletReport))); v != 1 {
		t.Errorf("patched counter %v", v)
	}
	if v := testutil.ToFloat64(m.EffectiveAllocatable.WithLabelValues("n1", "cpu")); v != 15.2 {
		t.Errorf("effective cpu gauge %v", v)
	}
	if v := testutil.ToFloat64(m.RawAllocatable.WithLabelValues("n1", "memory")); v != 30*(1<<30) {
		t.Errorf("raw memory gauge %v", v)
	}
	if v := testutil.ToFloat64(m.Ratio.WithLabelValues("n1", "memory")); v != 1.5 {
		t.Errorf("ratio gauge %v", v)
	}

	// The next write by another user changing only conditions needs no patch.
	stored := got
	again := stored.DeepCopy()
	again.Status.Conditions[0].Message = "changed by a node problem detector"
	resp = decodeResponse(t, post(h, reviewFor(t, "system:serviceaccount:kube-system:npd", nil, again, stored), "application/json"))
	if len(resp.Patch) != 0 || resp.PatchType != nil {
		t.Fatalf("unexpected patch %s", resp.Patch)
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeUnchanged, "other", string(reasonAnnotation))); v != 1 {
		t.Errorf("unchanged counter %v", v)
	}
}

func TestHandlerUntrustedWriteCountedAndRepaired(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	ann := map[string]string{annRaw: `{"cpu":"7600m","memory":"30Gi"}`, annRatios: `{"cpu":"2","memory":"1.5"}`, annApplied: "oversell-pool"}
	old := realisticNode("n1", "15200m", "45Gi", ann)
	obj := realisticNode("n1", "30400m", "45Gi", ann) // someone multiplied again
	resp := decodeResponse(t, post(h, reviewFor(t, "compounder", nil, obj, old), "application/json"))
	if q := patchedNode(t, obj, resp).Status.Allocatable["cpu"]; q.String() != "15200m" {
		t.Fatalf("cpu %s", q.String())
	}
	if v := testutil.ToFloat64(m.UntrustedAllocatableWrites.WithLabelValues("compounder")); v != 1 {
		t.Errorf("untrusted counter %v", v)
	}
	// A configured trusted reporter is raw.
	resp = decodeResponse(t, post(h, reviewFor(t, "harness", nil, realisticNode("n1", "6", "30Gi", ann), old), "application/json"))
	if q := patchedNode(t, obj, resp).Status.Allocatable["cpu"]; q.String() != "12" {
		t.Fatalf("trusted cpu %s", q.String())
	}
}

// A raw annotation anyone who can annotate nodes may set is never published
// beyond capacity × ratio: the tester's repro (capacity memory 32386524Ki,
// ratio 1.5) used to get "replace /status/allocatable/memory 1e30".
func TestHandlerImplausibleRawNotPublished(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	ann := map[string]string{annRaw: `{"cpu":"7600m","memory":"1e30"}`, annRatios: `{"cpu":"2","memory":"1.5"}`, annApplied: "oversell-pool"}
	old := realisticNode("n1", "15200m", "45Gi", ann)
	obj := realisticNode("n1", "15200m", "45Gi", ann)
	obj.Status.Conditions[0].Message = "changed by a node problem detector"
	resp := decodeResponse(t, post(h, reviewFor(t, "system:serviceaccount:kube-system:npd", nil, obj, old), "application/json"))
	if len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "raw-unknown") {
		t.Fatalf("patch %s warnings %v", resp.Patch, resp.Warnings)
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeSkipped, "other", string(reasonRawUnknown))); v != 1 {
		t.Errorf("skipped counter %v", v)
	}
	// The kubelet's next report replaces the bad raw.
	kub := realisticNode("n1", "7600m", "30Gi", ann)
	got := patchedNode(t, kub, decodeResponse(t, post(h, reviewFor(t, "system:node:n1", kubeletGroups, kub, old), "application/json")))
	if q := got.Status.Allocatable["memory"]; q.String() != "45Gi" {
		t.Errorf("memory %s", q.String())
	}
	if got.Annotations[annRaw] != `{"cpu":"7600m","memory":"30Gi"}` {
		t.Errorf("raw %s", got.Annotations[annRaw])
	}
}

// A kubelet write without allocatable is admitted unchanged with no
// bookkeeping; it used to record raw-allocatable "{}", after which every
// other writer was skipped as raw-unknown.
func TestHandlerNoAllocatableRecordsNothing(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	good := string(reviewFor(t, "system:node:n1", kubeletGroups, obj, obj))
	objStart := strings.Index(good, `"object":`)
	for name, repl := range map[string][2]string{
		"status null":      {`"status":{"capacity"`, `"status":null,"x":{"capacity"`},
		"allocatable null": {`"allocatable":{`, `"allocatable":null,"x":{`},
	} {
		t.Run(name, func(t *testing.T) {
			body := good[:objStart] + strings.Replace(good[objStart:], repl[0], repl[1], 1)
			if body == good {
				t.Fatal("replacement not applied")
			}
			resp := decodeResponse(t, post(h, []byte(body), "application/json"))
			if len(resp.Patch) != 0 || len(resp.Warnings) != 0 {
				t.Fatalf("patch %s warnings %v", resp.Patch, resp.Warnings)
			}
		})
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeUnchanged, "kubelet", string(reasonNoAllocatable))); v != 2 {
		t.Errorf("unchanged counter %v", v)
	}
}

func TestHandlerDeselectionRestoresAndDropsSeries(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	patchedNode(t, obj, decodeResponse(t, post(h, reviewFor(t, "system:node:n1", kubeletGroups, obj, obj), "application/json")))
	if n := testutil.CollectAndCount(m.EffectiveAllocatable); n != 2 {
		t.Fatalf("series %d", n)
	}
	ann := map[string]string{annRaw: `{"cpu":"7600m","memory":"30Gi"}`, annRatios: `{"cpu":"2","memory":"1.5"}`, annApplied: "oversell-pool"}
	amplified := realisticNode("n1", "15200m", "45Gi", ann)
	delete(amplified.Labels, "pool") // label removed: no longer selected
	resp := decodeResponse(t, post(h, reviewFor(t, "admin", nil, amplified, amplified), "application/json"))
	got := patchedNode(t, amplified, resp)
	if q := got.Status.Allocatable["cpu"]; q.String() != "7600m" {
		t.Errorf("cpu %s", q.String())
	}
	for _, k := range annotationKeys {
		if _, ok := got.Annotations[k]; ok {
			t.Errorf("annotation %s kept", k)
		}
	}
	if n := testutil.CollectAndCount(m.EffectiveAllocatable); n != 0 {
		t.Errorf("series left %d", n)
	}
}

func TestHandlerOverlapOneApplies(t *testing.T) {
	objs := append(nodeOversells(t, "low", "3", "3", 0, testTime(1)), nodeOversells(t, "high", "1.5", "1.25", 10, testTime(5))...)
	h, _ := testHandler(t, BuildSnapshot(objs, nil, true))
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	got := patchedNode(t, obj, decodeResponse(t, post(h, reviewFor(t, "system:node:n1", kubeletGroups, obj, obj), "application/json")))
	if got.Annotations[annApplied] != "high" || got.Annotations[annRatios] != `{"cpu":"1.5","memory":"1.25"}` {
		t.Fatalf("annotations %v", got.Annotations)
	}
	if q := got.Status.Allocatable["cpu"]; q.String() != "11400m" {
		t.Fatalf("cpu %s", q.String())
	}
}

// TestHandlerOverlapChainedServers sends one kubelet report through the
// servers of two overlapping NodeOversells in API-server order (issue 11):
// the losing one passes it through, and the winner's output, sent again to
// the winner's server (a second hookwright webhook before it, or
// reinvocation), keeps the raw.
func TestHandlerOverlapChainedServers(t *testing.T) {
	objs := append(nodeOversells(t, "low", "3", "3", 0, testTime(1)), nodeOversells(t, "high", "1.5", "1.25", 10, testTime(5))...)
	snap := BuildSnapshot(objs, nil, true)
	low, _ := testHandler(t, snap)
	low.ForNodeOversell("low")
	high, m := testHandler(t, snap)
	high.ForNodeOversell("high")
	old := realisticNode("n1", "7600m", "30Gi", nil)
	obj := old.DeepCopy()
	if resp := decodeResponse(t, post(low, reviewFor(t, "system:node:n1", kubeletGroups, obj, old), "application/json")); len(resp.Patch) != 0 || len(resp.Warnings) != 0 {
		t.Fatalf("the losing server must pass the write through, got patch %s warnings %v", resp.Patch, resp.Warnings)
	}
	obj = patchedNode(t, obj, decodeResponse(t, post(high, reviewFor(t, "system:node:n1", kubeletGroups, obj, old), "application/json")))
	if resp := decodeResponse(t, post(high, reviewFor(t, "system:node:n1", kubeletGroups, obj, old), "application/json")); len(resp.Patch) != 0 {
		obj = patchedNode(t, obj, resp)
	}
	if resp := decodeResponse(t, post(low, reviewFor(t, "system:node:n1", kubeletGroups, obj, old), "application/json")); len(resp.Patch) != 0 {
		t.Fatalf("the losing server must pass the winner's output through, got %s", resp.Patch)
	}
	if obj.Annotations[annApplied] != "high" || obj.Annotations[annRaw] != `{"cpu":"7600m","memory":"30Gi"}` {
		t.Fatalf("annotations %v", obj.Annotations)
	}
	if q := obj.Status.Allocatable["cpu"]; q.String() != "11400m" {
		t.Fatalf("cpu %s, want 7600m × 1.5", q.String())
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeUnchanged, "kubelet", string(reasonStaleReport))); v != 1 {
		t.Errorf("the winner's own output sent again counted %v times as stale-report, want 1", v)
	}
}

func TestHandlerDryRunLeavesGauges(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	body := bytes.Replace(reviewFor(t, "system:node:n1", kubeletGroups, obj, obj), []byte(`"dryRun":false`), []byte(`"dryRun":true`), 1)
	resp := decodeResponse(t, post(h, body, "application/json"))
	if len(resp.Patch) == 0 {
		t.Fatal("dry run must still be patched")
	}
	if n := testutil.CollectAndCount(m.EffectiveAllocatable); n != 0 {
		t.Errorf("dry run set %d series", n)
	}
}

// Requests the handler does not own are admitted unchanged with a warning.
func TestHandlerIgnoresOtherRequests(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	base := reviewFor(t, "system:node:n1", kubeletGroups, obj, obj)
	for name, mutate := range map[string]func(*admissionv1.AdmissionReview){
		"nodes without subresource": func(rv *admissionv1.AdmissionReview) { rv.Request.SubResource = "" },
		"CREATE of nodes/status":    func(rv *admissionv1.AdmissionReview) { rv.Request.Operation = admissionv1.Create },
		"pods": func(rv *admissionv1.AdmissionReview) {
			rv.Request.Resource.Resource = "pods"
			rv.Request.SubResource = ""
		},
		"other group nodes": func(rv *admissionv1.AdmissionReview) { rv.Request.Resource.Group = "example.com" },
	} {
		t.Run(name, func(t *testing.T) {
			var rv admissionv1.AdmissionReview
			_ = json.Unmarshal(base, &rv)
			mutate(&rv)
			body, _ := json.Marshal(&rv)
			resp := decodeResponse(t, post(h, body, "application/json"))
			if len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "only UPDATE of nodes/status") {
				t.Fatalf("patch %q warnings %v", resp.Patch, resp.Warnings)
			}
		})
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeIgnored, "unknown", string(reasonNotNodeStatus))); v != 4 {
		t.Errorf("ignored counter %v", v)
	}
}

// A request with no operation or resource gets a warning naming them as
// absent, not blank (";  of  admitted unchanged").
func TestHandlerIgnoredWarningNamesAbsentFields(t *testing.T) {
	h, _ := testHandler(t, poolSnapshot(t))
	w := post(h, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}`), "application/json")
	var rv admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &rv); err != nil || w.Code != http.StatusOK || rv.Response == nil {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	want := "hookwright oversell handles only UPDATE of nodes/status; (no operation) of (no resource) admitted unchanged"
	if !rv.Response.Allowed || len(rv.Response.Warnings) != 1 || rv.Response.Warnings[0] != want {
		t.Fatalf("warnings %q", rv.Response.Warnings)
	}
	for _, c := range []struct {
		group, res, sub, op, want string
	}{
		{"", "nodes", "", "UPDATE", "UPDATE of nodes"},
		{"example.com", "nodes", "status", "UPDATE", "UPDATE of nodes.example.com/status"},
		{"", "nodes", "status", "CREATE", "CREATE of nodes/status"},
	} {
		req := &requestJSON{SubResource: c.sub, Operation: c.op}
		req.Resource.Group, req.Resource.Resource = c.group, c.res
		if got := describeRequest(req); got != c.want {
			t.Errorf("describeRequest = %q, want %q", got, c.want)
		}
	}
}

// Internal problems never block a heartbeat: allowed, no patch, a warning
// and a metric.
func TestHandlerInternalProblemsAdmitUnchanged(t *testing.T) {
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	review := reviewFor(t, "system:node:n1", kubeletGroups, obj, obj)

	t.Run("config not synced", func(t *testing.T) {
		h, m := testHandler(t, BuildSnapshot(nil, nil, false))
		resp := decodeResponse(t, post(h, review, "application/json"))
		if len(resp.Patch) != 0 || len(resp.Warnings) != 1 {
			t.Fatalf("patch %q warnings %v", resp.Patch, resp.Warnings)
		}
		if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeSkipped, "unknown", string(reasonNotSynced))); v != 1 {
			t.Errorf("counter %v", v)
		}
	})
	t.Run("node object of the wrong shape", func(t *testing.T) {
		h, m := testHandler(t, poolSnapshot(t))
		body := bytes.Replace(review, []byte(`"labels":{`), []byte(`"labels":7,"x":{`), 1)
		resp := decodeResponse(t, post(h, body, "application/json"))
		if len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "decode-error") {
			t.Fatalf("patch %q warnings %v", resp.Patch, resp.Warnings)
		}
		if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeError, "other", string(reasonDecode))); v != 1 {
			t.Errorf("counter %v", v)
		}
	})
	t.Run("panic in the decision", func(t *testing.T) {
		snap := poolSnapshot(t)
		snap.Policies[0].Selector = nil // Select will panic
		h, m := testHandler(t, snap)
		resp := decodeResponse(t, post(h, review, "application/json"))
		if len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "panic") {
			t.Fatalf("patch %q warnings %v", resp.Patch, resp.Warnings)
		}
		if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeError, "other", string(reasonPanic))); v != 1 {
			t.Errorf("counter %v", v)
		}
	})
	t.Run("raw unknown", func(t *testing.T) {
		h, m := testHandler(t, poolSnapshot(t))
		ann := map[string]string{annRaw: `{"cpu":`, annRatios: `{"cpu":"2"}`, annApplied: "oversell-pool"}
		amplified := realisticNode("n1", "15200m", "30Gi", ann)
		resp := decodeResponse(t, post(h, reviewFor(t, "admin", nil, amplified, amplified), "application/json"))
		if len(resp.Patch) != 0 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "raw-unknown") {
			t.Fatalf("patch %q warnings %v", resp.Patch, resp.Warnings)
		}
		if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeSkipped, "other", string(reasonRawUnknown))); v != 1 {
			t.Errorf("counter %v", v)
		}
	})
}

// Malformed requests get a clear 4xx, never a 500 or a panic.
func TestHandlerMalformedRequests(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	good := reviewFor(t, "system:node:n1", kubeletGroups, obj, obj)
	cases := []struct {
		name        string
		method      string
		body        io.Reader
		contentType string
		length      int64
		code        int
		msg         string
	}{
		{"GET", http.MethodGet, nil, "application/json", -1, http.StatusMethodNotAllowed, "method GET"},
		{"no content type", http.MethodPost, bytes.NewReader(good), "", -1, http.StatusUnsupportedMediaType, "content type"},
		{"wrong content type", http.MethodPost, bytes.NewReader(good), "application/yaml", -1, http.StatusUnsupportedMediaType, "content type"},
		{"declared too large", http.MethodPost, bytes.NewReader(good), "application/json", maxBodyBytes + 1, http.StatusRequestEntityTooLarge, "exceeds"},
		{"streamed too large", http.MethodPost, io.MultiReader(bytes.NewReader([]byte(`{"a":"`)), bytes.NewReader(bytes.Repeat([]byte("x"), maxBodyBytes))), "application/json", -1, http.StatusRequestEntityTooLarge, "exceeds"},
		{"empty", http.MethodPost, bytes.NewReader(nil), "application/json", -1, http.StatusBadRequest, "malformed"},
		{"not JSON", http.MethodPost, strings.NewReader("hello"), "application/json", -1, http.StatusBadRequest, "malformed"},
		{"truncated", http.MethodPost, bytes.NewReader(good[:len(good)/2]), "application/json; charset=utf-8", -1, http.StatusBadRequest, "malformed"},
		{"JSON array", http.MethodPost, strings.NewReader(`[1,2]`), "application/json", -1, http.StatusBadRequest, "want an object"},
		{"wrong kind", http.MethodPost, bytes.NewReader(bytes.Replace(good, []byte(`"kind":"AdmissionReview"`), []byte(`"kind":"Node"`), 1)), "application/json", -1, http.StatusBadRequest, "expected admission.k8s.io/v1 AdmissionReview"},
		{"v1beta1", http.MethodPost, bytes.NewReader(bytes.Replace(good, []byte(`admission.k8s.io/v1"`), []byte(`admission.k8s.io/v1beta1"`), 1)), "application/json", -1, http.StatusBadRequest, "expected admission.k8s.io/v1 AdmissionReview"},
		{"invalid number in a skipped member", http.MethodPost, strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":1-2-3e+e,"request":{"uid":"u"}}`), "application/json", -1, http.StatusBadRequest, "malformed"},
		{"no request", http.MethodPost, strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), "application/json", -1, http.StatusBadRequest, "no request"},
		{"no uid", http.MethodPost, bytes.NewReader(bytes.Replace(good, []byte(`"uid":"0d3c6e1a-8b2f-4a7d-9c1e-5f6a7b8c9d0e"`), []byte(`"uid":""`), 1)), "application/json", -1, http.StatusBadRequest, "no request.uid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, "/oversell", c.body)
			if c.contentType != "" {
				r.Header.Set("Content-Type", c.contentType)
			}
			r.ContentLength = c.length
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != c.code || !strings.Contains(w.Body.String(), c.msg) {
				t.Fatalf("got %d %q, want %d containing %q", w.Code, w.Body, c.code, c.msg)
			}
		})
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeError, "unknown", "malformed")); v != float64(len(cases)) {
		t.Errorf("malformed counter %v", v)
	}
	if n := testutil.CollectAndCount(m.Duration); n != 1 {
		t.Errorf("histogram not collected")
	}
}

func TestSnapshotSelectNilSelectorGuard(t *testing.T) {
	// A nil NodeSelector on the CR selects every node (labels.Everything).
	s := BuildSnapshot(nodeOversellsSel(t, "all", nil), nil, true)
	if p := s.policyFor(labels.Set{"any": "thing"}); p == nil || p.Name != "all" {
		t.Fatalf("got %v", p)
	}
}
