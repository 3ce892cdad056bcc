package sidecar

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// A review declaring a 3 MiB Content-Length of which one byte arrives must
// not make the handler allocate the declared size: it used to Grow its
// buffer to Content-Length before reading (issue 11: 100 such connections
// took an injector from 56 MB to 350 MB resident).
func TestHandlerDeclaredLengthAllocatesNothingLarge(t *testing.T) {
	h := newTestHandler(t, sampleConfig(t))
	req := httptest.NewRequest(http.MethodPost, "/inject", io.MultiReader(strings.NewReader("{"), errReader{}))
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = MaxBodyBytes
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
		t.Fatalf("one byte of a declared %d byte body allocated %d bytes", MaxBodyBytes, got)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
