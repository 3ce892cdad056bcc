package oversell

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hookwright/hookwright/webhooks/serving"
)

// The oversell handler reads bodies through its envelope: while the
// in-flight budget is held a review gets 429 "server busy" (counted with
// reason busy), and once it is freed the same review is decided.
func TestHandlerEnvelopeBudget(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	h.Envelope = serving.NewEnvelope(serving.EnvelopeOptions{MaxBody: 256 << 10, MaxInflight: 256 << 10, BudgetWait: 10 * time.Millisecond})
	n := realisticNode("n1", "7600m", "30Gi", nil)
	review := reviewFor(t, "system:node:n1", kubeletGroups, n, n)

	held, err := h.Envelope.Read(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(make([]byte, 200<<10))))
	if err != nil {
		t.Fatal(err)
	}
	w := post(h, review, "application/json")
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "server busy") {
		t.Fatalf("got %d %q, want 429 server busy", w.Code, w.Body)
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeError, "unknown", "busy")); v != 1 {
		t.Errorf("busy counter %v", v)
	}
	held.Release()
	decodeResponse(t, post(h, review, "application/json"))
}

// A declared Content-Length is never allocated up front.
func TestHandlerDeclaredLengthAllocatesNothingLarge(t *testing.T) {
	h, _ := testHandler(t, poolSnapshot(t))
	r := httptest.NewRequest(http.MethodPost, "/oversell", io.MultiReader(strings.NewReader("{"), errReader{}))
	r.Header.Set("Content-Type", "application/json")
	r.ContentLength = maxBodyBytes
	allocs := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			r.Body = io.NopCloser(io.MultiReader(strings.NewReader("{"), errReader{}))
			h.ServeHTTP(httptest.NewRecorder(), r)
		}
	}).AllocedBytesPerOp()
	if allocs > 256<<10 {
		t.Fatalf("one byte of a declared %d byte body allocated %d bytes", maxBodyBytes, allocs)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
