package serving

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// trickle yields its bytes one Read at a time, then blocks until release
// is closed and returns io.ErrUnexpectedEOF: a client that declared more
// than it sends.
type trickle struct {
	data    []byte
	release chan struct{}
}

func (t *trickle) Read(p []byte) (int, error) {
	if len(t.data) > 0 {
		p[0] = t.data[0]
		t.data = t.data[1:]
		return 1, nil
	}
	<-t.release
	return 0, io.ErrUnexpectedEOF
}

func post(body io.Reader, contentLength int64) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/x", body)
	r.ContentLength = contentLength
	return r
}

func bodyErr(t *testing.T, err error) *BodyError {
	t.Helper()
	var be *BodyError
	if !errors.As(err, &be) {
		t.Fatalf("got %v, want a *BodyError", err)
	}
	return be
}

// A declared 3 MiB body of which one byte arrives must not cost 3 MiB: the
// injector used to Grow its buffer to the declared Content-Length.
func TestReadDoesNotAllocateFromContentLength(t *testing.T) {
	e := NewEnvelope(EnvelopeOptions{})
	tr := &trickle{data: []byte("{"), release: make(chan struct{})}
	close(tr.release)
	r := post(tr, DefaultMaxBody)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := e.Read(httptest.NewRecorder(), r)
	runtime.ReadMemStats(&after)
	if be := bodyErr(t, err); be.Status != http.StatusBadRequest {
		t.Fatalf("got %d %q, want 400 for a short body", be.Status, be.Msg)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 256<<10 {
		t.Fatalf("reading 1 byte of a declared %d byte body allocated %d bytes", DefaultMaxBody, got)
	}
}

func TestReadGrowsWithBytesReceived(t *testing.T) {
	e := NewEnvelope(EnvelopeOptions{})
	for _, n := range []int{0, 1, 16 << 10, 16<<10 + 1, 300 << 10, 1<<20 + 5, DefaultMaxBody} {
		data := bytes.Repeat([]byte("a"), n)
		b, err := e.Read(httptest.NewRecorder(), post(bytes.NewReader(data), -1))
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(b.bytes(), data) {
			t.Fatalf("%d bytes: body differs", n)
		}
		if c := cap(b.bytes()); c > 2*n+16<<10 {
			t.Fatalf("%d bytes held in a %d byte buffer", n, c)
		}
		b.Release()
	}
	if avail := e.budget.TryAcquire(e.inflight); !avail {
		t.Fatal("budget not returned after Release")
	}
}

func TestReadTooLarge(t *testing.T) {
	e := NewEnvelope(EnvelopeOptions{MaxBody: 100 << 10})
	for name, r := range map[string]*http.Request{
		"declared": post(strings.NewReader("{}"), 100<<10+1),
		"streamed": post(bytes.NewReader(make([]byte, 100<<10+1)), -1),
		"lying":    post(bytes.NewReader(make([]byte, 200<<10)), 1000),
	} {
		_, err := e.Read(httptest.NewRecorder(), r)
		if be := bodyErr(t, err); be.Status != http.StatusRequestEntityTooLarge && !(name == "lying" && be.Status == http.StatusBadRequest) {
			t.Fatalf("%s: got %d %q, want 413", name, be.Status, be.Msg)
		}
	}
	if !e.budget.TryAcquire(e.inflight) {
		t.Fatal("budget not returned after refusals")
	}
}

// Bodies beyond the in-flight budget wait, then get 429; room freed by a
// Release lets the next one in.
func TestReadBudget(t *testing.T) {
	e := NewEnvelope(EnvelopeOptions{MaxBody: 64 << 10, MaxInflight: 64 << 10, BudgetWait: 50 * time.Millisecond})
	held, err := e.Read(httptest.NewRecorder(), post(bytes.NewReader(make([]byte, 40<<10)), -1))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Read(httptest.NewRecorder(), post(strings.NewReader("{}"), 2))
	if be := bodyErr(t, err); be.Status != http.StatusTooManyRequests || !strings.Contains(be.Msg, "server busy") {
		t.Fatalf("got %d %q, want 429", be.Status, be.Msg)
	}
	held.Release()
	b, err := e.Read(httptest.NewRecorder(), post(strings.NewReader("{}"), 2))
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	b.Release()
}

func TestDeadline(t *testing.T) {
	e := NewEnvelope(EnvelopeOptions{Timeout: 10 * time.Second})
	start := time.Unix(1000, 0)
	for q, want := range map[string]time.Duration{
		"":              10 * time.Second,
		"?timeout=2s":   2 * time.Second,
		"?timeout=60s":  10 * time.Second, // a caller cannot extend the bound
		"?timeout=-1s":  10 * time.Second,
		"?timeout=junk": 10 * time.Second,
	} {
		r := httptest.NewRequest(http.MethodPost, "/x"+q, nil)
		if got := e.deadline(r, start).Sub(start); got != want {
			t.Errorf("%q: got %v, want %v", q, got, want)
		}
	}
}

func TestFail(t *testing.T) {
	rec := httptest.NewRecorder()
	Fail(rec, &BodyError{Status: http.StatusRequestTimeout, Reason: ReasonTimeout, Msg: "slow"})
	if rec.Code != http.StatusRequestTimeout || rec.Header().Get("Connection") != "close" || !strings.Contains(rec.Body.String(), "slow") {
		t.Fatalf("got %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
	rec = httptest.NewRecorder()
	Fail(rec, errors.New("plain"))
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("got %d", rec.Code)
	}
}

// Buffers move through the pooled classes, so a steady stream of reviews
// reuses them instead of allocating.
func TestNextSizeFollowsClasses(t *testing.T) {
	var got []int
	for c := 0; c < DefaultMaxBody; c = nextSize(c, DefaultMaxBody) {
		got = append(got, c)
	}
	want := []int{0, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sizes %v, want %v then %d", got, want, DefaultMaxBody)
	}
	for _, c := range classes {
		p := getBuf(c)
		putBuf(p, p.b)
	}
	if a := testing.AllocsPerRun(100, func() {
		p := getBuf(64 << 10)
		putBuf(p, p.b)
	}); a > 0 {
		t.Fatalf("%v allocations per pooled 64 KiB buffer", a)
	}
}

// TestReadDeadlineExcludesServerStalls: the time between one read's
// return and the next read is the server's (a CPU-starved server pod, a GC
// pause), so it never shortens the client's allowance; the time a read
// waits is the client's. Charged to the client, a stall of a second set a
// deadline already past, and the demo's starved server pods refused every
// review in flight with 408 during a CA rotation.
func TestReadDeadlineExcludesServerStalls(t *testing.T) {
	t0 := time.Unix(1000, 0)
	d := readDeadline{start: t0, last: t0, deadline: t0.Add(10 * time.Second)}
	// The server stalls 1.5 s before its first read: the client still
	// has BodyGrace from that read.
	if got, want := d.next(t0.Add(1500*time.Millisecond), 0), t0.Add(1500*time.Millisecond+BodyGrace); !got.Equal(want) {
		t.Fatalf("after a 1.5 s stall: deadline %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	// That read waits 800 ms for 1 KiB (the client's time), and the next
	// read is issued at once: no more allowance than the rate gives.
	d.last = t0.Add(2300 * time.Millisecond)
	got := d.next(d.last, 1<<10)
	want := t0.Add(1500*time.Millisecond + BodyGrace + time.Duration(int64(1<<10)*int64(time.Second)/minBodyRate))
	if !got.Equal(want) {
		t.Fatalf("slow client: deadline %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	// Never past the request's deadline, however long the stalls.
	d.last = t0
	if got := d.next(t0.Add(9900*time.Millisecond), 0); !got.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("capped: deadline %v, want 10s", got.Sub(t0))
	}
}

// TestStalledServerReadsTheBodyItWasSent: the server stalls past the rate
// deadline after setting it (as a CPU-starved node does while the reader
// waits for the poller), and the client sends the body into the socket
// during the stall, over a real TLS connection. The timed-out read is read
// again and the review is answered 200 with a live context; before, it
// was refused with 408. A client that sends nothing still gets 408 once
// the retries are spent.
func TestStalledServerReadsTheBodyItWasSent(t *testing.T) {
	var stalls atomic.Int32
	inStall := make(chan struct{}, 1)
	old := stallHook
	stallHook = func() {
		if stalls.Add(-1) >= 0 {
			inStall <- struct{}{}
			time.Sleep(BodyGrace + 300*time.Millisecond)
		}
	}
	t.Cleanup(func() { stallHook = old })

	var ctxErr atomic.Value
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = Serve(w, r, nil, func(r *http.Request, body, dst []byte) ([]byte, error) {
			ctxErr.Store(fmt.Sprint(r.Context().Err()))
			return append(dst, body...), nil
		})
	}))
	defer srv.Close()
	post := func(body func(w *io.PipeWriter)) *http.Response {
		t.Helper()
		pr, pw := io.Pipe()
		defer pw.Close()
		go body(pw)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/x?timeout=10s", pr)
		req.ContentLength = int64(len(`{"ok":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	stalls.Store(1)
	resp := post(func(w *io.PipeWriter) {
		<-inStall
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != `{"ok":true}` {
		t.Fatalf("after a stall: %d %q, want 200 and the body", resp.StatusCode, b)
	}
	if got := ctxErr.Load(); got != "<nil>" {
		t.Fatalf("review context after a stall: %v, want live", got)
	}
	if !resp.Close {
		t.Error("the connection of a retried read is not closed after the answer")
	}

	// A body that never comes: every retry times out, then 408.
	stalls.Store(0)
	resp = post(func(*io.PipeWriter) {})
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a body that never comes: %d, want 408", resp.StatusCode)
	}
}
