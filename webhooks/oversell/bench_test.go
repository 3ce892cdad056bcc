package oversell

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// benchReview is a steady-state kubelet heartbeat on an amplified ~20 KB
// node: the kubelet sends its real values, the stored object is amplified,
// the answer is a two-operation patch.
func benchReview(b *testing.B) []byte {
	b.Helper()
	ann := map[string]string{annRaw: `{"cpu":"7600m","memory":"30Gi"}`, annRatios: `{"cpu":"2","memory":"1.5"}`, annApplied: "oversell-pool"}
	obj := realisticNode("n1", "7600m", "30Gi", ann)
	old := realisticNode("n1", "15200m", "45Gi", ann)
	return reviewFor(b, "system:node:n1", kubeletGroups, obj, old)
}

// TestBenchNodeSize pins the benchmark object at a realistic size.
func TestBenchNodeSize(t *testing.T) {
	raw, _ := json.Marshal(realisticNode("n1", "7600m", "30Gi", nil))
	if len(raw) < 18<<10 || len(raw) > 24<<10 {
		t.Fatalf("node is %d bytes, want about 20 KB", len(raw))
	}
	t.Logf("node %d bytes", len(raw))
}

// discardWriter is a reusable ResponseWriter so the benchmark measures the
// handler, not httptest.
type discardWriter struct {
	h    http.Header
	code int
	n    int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// BenchmarkHandler is the full handler: AdmissionReview bytes in, response
// bytes out. Compare with BenchmarkFloor in the same run.
func BenchmarkHandler(b *testing.B) {
	body := benchReview(b)
	h, _ := testHandler(b, poolSnapshot(b))
	req := httptest.NewRequest(http.MethodPost, "/oversell", nil)
	req.Header.Set("Content-Type", "application/json")
	rd := bytes.NewReader(body)
	req.Body = io.NopCloser(rd)
	req.ContentLength = int64(len(body))
	w := &discardWriter{h: http.Header{}}

	// Sanity: the benchmarked request is patched.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/oversell", bytes.NewReader(body)).WithContext(req.Context()))
	if rec.Code != http.StatusUnsupportedMediaType { // no content type on that probe
		b.Fatalf("probe %d", rec.Code)
	}
	probe := httptest.NewRequest(http.MethodPost, "/oversell", bytes.NewReader(body))
	probe.Header.Set("Content-Type", "application/json")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, probe)
	if !bytes.Contains(rec.Body.Bytes(), []byte(`"patchType":"JSONPatch"`)) {
		b.Fatalf("benchmark request not patched: %s", rec.Body)
	}

	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd.Reset(body)
		h.ServeHTTP(w, req)
	}
}

// BenchmarkFloor is the floor: a bare encoding/json decode of the same
// AdmissionReview into admissionv1.AdmissionReview and an encode of it.
func BenchmarkFloor(b *testing.B) {
	body := benchReview(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var rv admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &rv); err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(&rv); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFloorDecodeOnly is a stricter reference: the decode alone.
func BenchmarkFloorDecodeOnly(b *testing.B) {
	body := benchReview(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var rv admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &rv); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecide is the pure engine plus patch on a heartbeat.
func BenchmarkDecide(b *testing.B) {
	pool := policy("oversell-pool", "2", "1.5")
	amplified := node("7600m", "23040Mi", amplifiedAnn())
	in := Input{Writer: WriterKubelet, Object: node("3800m", "15Gi", amplifiedAnn()), Old: &amplified, Policy: pool}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf, _ = AppendPatch(buf[:0], in.Object, Decide(in))
	}
}

// BenchmarkTLSThroughput runs the handler behind a TLS 1.3, HTTP/1.1
// keep-alive server with 8 concurrent clients per core, all in this process
// (so clients share the cores), and reports reviews per second per core.
func BenchmarkTLSThroughput(b *testing.B) {
	body := benchReview(b)
	h, _ := testHandler(b, poolSnapshot(b))
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = false
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut by Close
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()
	tr := client.Transport.(*http.Transport)
	tr.MaxIdleConnsPerHost = 256
	tr.MaxConnsPerHost = 0
	// The API server's client writes a review in few syscalls; so does this
	// load generator, so the figure is about the server.
	tr.WriteBufferSize = 64 << 10
	tr.ReadBufferSize = 16 << 10

	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		for pb.Next() {
			resp, err := client.Post(srv.URL+"/oversell", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	perSec := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(perSec, "reviews/s")
	b.ReportMetric(perSec/float64(runtime.GOMAXPROCS(0)), "reviews/s/core")
}
