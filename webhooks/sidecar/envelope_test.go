package sidecar

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// A review declaring a 3 MiB Content-Length of which one byte arrives must
// not make the handler allocate the declared size: it used to Grow its
// buffer to Content-Length before reading (issue 11: 100 such connections
// took an injector from 56 MB to 350 MB resident).
func TestHandlerDeclaredLengthAllocatesNothingLarge(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	req := httptest.NewRequest(http.MethodPost, "/inject", io.MultiReader(strings.NewReader("{"), errReader{}))
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = maxBodyBytes
	rec := httptest.NewRecorder()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h.ServeHTTP(rec, req)
	runtime.ReadMemStats(&after)
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("got %d %q, want 400", rec.Code, rec.Body)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 256<<10 {
		t.Fatalf("one byte of a declared %d byte body allocated %d bytes", maxBodyBytes, got)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// sidecarSeries counts the hookwright_sidecar_ series on the registry.
func sidecarSeries(t *testing.T) int {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "hookwright_sidecar_") {
			n += len(mf.GetMetric())
		}
	}
	return n
}

// Label values of the injector's metrics never come from request bodies:
// once every path has been taken, reviews with ever new namespaces, pod
// names, labels, annotations, methods and content types add no series, so
// an unauthenticated caller cannot grow the server's memory through them.
func TestHandlerMetricsBoundedAgainstRequestBodies(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	round := func(from, to int) {
		for i := from; i < to; i++ {
			pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p-%d","labels":{"l-%d":"v-%d","sidecar.hookwright.io/inject":"maybe-%d"},"annotations":{"sidecar.hookwright.io/status":"junk-%d","a-%d":"b"}},"spec":{"hostNetwork":%t,"containers":[{"name":"c-%d","image":"i-%d"}]}}`, i, i, i, i, i%2*i, i, i%3 == 0, i, i)
			for _, ns := range []string{fmt.Sprintf("ns-%d", i), "kube-system", "hookwright-system"} {
				serve(h, reviewFor(t, []byte(pod), ns, i%2 == 0), "application/json")
			}
			serve(h, []byte(fmt.Sprintf(`{"apiVersion":"v%d","kind":"AdmissionReview"}`, i)), "application/json")
			serve(h, []byte(pod), fmt.Sprintf("text/x-%d", i))
			req := httptest.NewRequest(fmt.Sprintf("M%d", i), "/inject", nil)
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
	round(0, 20)
	warm := sidecarSeries(t)
	round(20, 400)
	if got := sidecarSeries(t); got != warm {
		t.Fatalf("series grew from %d to %d with new names in request bodies", warm, got)
	}
}
