package sidecar

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// samplePath is the shipped sample CR: golden tests, the fuzz target and the
// benchmarks render these very templates.
var samplePath = filepath.Join("..", "..", "config", "samples", "admission_v1alpha1_sidecarinjector.yaml")

var testParams = Params{OperatorNamespace: "hookwright-system", ServerVersion: "v1.33.1"}

func sampleCR(tb testing.TB) *v1alpha1.SidecarInjector {
	tb.Helper()
	b, err := os.ReadFile(samplePath)
	if err != nil {
		tb.Fatal(err)
	}
	cr, err := DecodeSidecarInjector(b)
	if err != nil {
		tb.Fatal(err)
	}
	cr.Generation = 1
	return cr
}

func sampleConfig(tb testing.TB) *Config {
	tb.Helper()
	c, err := Compile(sampleCR(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func newTestHandler(tb testing.TB, cfg *Config) *Handler {
	tb.Helper()
	s := &Store{}
	if cfg != nil {
		s.cur.Store(cfg)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	return &Handler{Store: s, Params: testParams, Log: logr.Discard(), Metrics: m, Injector: "sidecar-injector"}
}

// reviewFor wraps a pod JSON in an AdmissionReview v1 CREATE request.
func reviewFor(tb testing.TB, pod []byte, namespace string, dryRun bool) []byte {
	tb.Helper()
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:             types.UID("0a8d2c4e-1b7f-4d52-9a0e-2f3c5d6e7f80"),
			Kind:            metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:        metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			RequestKind:     &metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			RequestResource: &metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace:       namespace,
			Operation:       admissionv1.Create,
			DryRun:          &dryRun,
		},
	}
	r.Request.Object.Raw = pod
	b, err := json.Marshal(r)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// serve posts body to h and returns the recorder.
func serve(h http.Handler, body []byte, contentType string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/inject", bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// admit runs a pod through the handler and returns the decoded response.
func admit(tb testing.TB, h http.Handler, pod []byte, namespace string) *admissionv1.AdmissionResponse {
	tb.Helper()
	rec := serve(h, reviewFor(tb, pod, namespace, false), "application/json")
	if rec.Code != http.StatusOK {
		tb.Fatalf("status %d: %s", rec.Code, rec.Body.String())
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		tb.Fatal(err)
	}
	if out.Response == nil {
		tb.Fatal("no response")
	}
	return out.Response
}

func applyPatch(tb testing.TB, doc, patch []byte) []byte {
	tb.Helper()
	if len(patch) == 0 {
		return doc
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := p.Apply(doc)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
