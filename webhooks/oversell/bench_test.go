package oversell

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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

// BenchmarkHandlerHeld is BenchmarkHandler on a restatement that is held
// (hold.go): heartbeat times 30 s newer than the stored ones, answered with
// a patch that puts the stored values back.
func BenchmarkHandlerHeld(b *testing.B) {
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	obj, old := restatement(now)
	body := reviewFor(b, "system:node:n1", kubeletGroups, obj, old)
	h, m := testHandler(b, poolSnapshot(b))
	h.now = func() time.Time { return now }
	req := httptest.NewRequest(http.MethodPost, "/oversell", nil)
	req.Header.Set("Content-Type", "application/json")
	rd := bytes.NewReader(body)
	req.Body = io.NopCloser(rd)
	req.ContentLength = int64(len(body))
	w := &discardWriter{h: http.Header{}}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rd.Reset(body)
		h.ServeHTTP(w, req)
	}
	b.StopTimer()
	if held := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeHeld, "kubelet", string(reasonKubeletReport))); held != float64(b.N) {
		b.Fatalf("%v of %d reviews held", held, b.N)
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
	in := Input{Writer: writerKubelet, Object: node("3800m", "15Gi", amplifiedAnn()), Old: &amplified, Policy: pool}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf, _ = appendPatch(buf[:0], in.Object, Decide(in))
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
	cpu0 := processCPU(b)
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
	b.StopTimer()
	perSec := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(perSec, "reviews/s")
	b.ReportMetric(perSec/float64(runtime.GOMAXPROCS(0)), "reviews/s/core")
	// CPU actually used by this process (server and clients): on a machine
	// shared with other work, wall-clock per core understates capacity.
	b.ReportMetric(float64(b.N)/(processCPU(b)-cpu0), "reviews/cpu-s")
}

// processCPU is the user+system CPU time of this process, in seconds.
func processCPU(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// TestHelperTLSServer is not a test: BenchmarkTLSServerProcess runs the test
// binary again with OVERSELL_BENCH_SERVER=1 so the server is a process of its
// own whose CPU time can be read apart from the load generator's.
func TestHelperTLSServer(t *testing.T) {
	if os.Getenv("OVERSELL_BENCH_SERVER") != "1" {
		return
	}
	h, _ := testHandler(t, poolSnapshot(t))
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = false
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	fmt.Printf("%s\n%s", srv.URL, certPEM)
	_, _ = io.Copy(io.Discard, os.Stdin) // serve until the benchmark closes stdin
}

// BenchmarkTLSServerProcess measures the server alone: TLS 1.3, HTTP/1.1
// keep-alive, 8 concurrent clients per core, the server in its own process.
// server-reviews/cpu-s is reviews answered per second of server CPU, i.e.
// what one fully used core sustains.
func BenchmarkTLSServerProcess(b *testing.B) {
	body := benchReview(b)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTLSServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "OVERSELL_BENCH_SERVER=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	rd := bufio.NewReader(stdout)
	url, err := rd.ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	var certPEM []byte
	for !bytes.Contains(certPEM, []byte("END CERTIFICATE")) {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			b.Fatal(err)
		}
		certPEM = append(certPEM, line...)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}},
		MaxIdleConnsPerHost: 256,
		WriteBufferSize:     64 << 10,
		ReadBufferSize:      16 << 10,
	}}
	target := strings.TrimSpace(url) + "/oversell"

	b.SetParallelism(8)
	cpu0 := childCPU(b, cmd.Process.Pid)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		for pb.Next() {
			resp, err := client.Post(target, "application/json", bytes.NewReader(body))
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
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reviews/s")
	b.ReportMetric(float64(b.N)/(childCPU(b, cmd.Process.Pid)-cpu0), "server-reviews/cpu-s")
}

// childCPU reads utime+stime of pid from /proc, in seconds.
func childCPU(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the line (proc(5)).
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return (ut + st) / 100 // USER_HZ is 100 on Linux
}
