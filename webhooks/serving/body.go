package serving

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Envelope defaults. DefaultMaxBody is the API server's request size limit
// (3 MiB), so any legitimate object fits; DefaultMaxInflight keeps the
// bodies of concurrent requests, and what decoding them costs, well inside
// the server Deployment's 256 Mi memory limit (controllers.DefaultResources).
const (
	DefaultMaxBody     = 3 << 20
	DefaultMaxInflight = 32 << 20
	// DefaultTimeout is the largest timeoutSeconds the API server accepts
	// for a webhook (admissionregistration.k8s.io/v1 validation: 1 to 30).
	DefaultTimeout = 30 * time.Second
	// defaultBudgetWait is how long a body waits for in-flight budget
	// before it is answered 429.
	defaultBudgetWait = time.Second
	// BodyGrace and minBodyRate are the slowest body accepted: after
	// BodyGrace, bytes must keep arriving at minBodyRate on average, so a
	// 3 MiB body has 4 s. The API server writes a review it holds in memory
	// at once, over the cluster network; a client trickling a body holds
	// buffer and budget for at most about BodyGrace.
	BodyGrace   = time.Second
	minBodyRate = 1 << 20 // bytes per second
	// maxStallRetries is how many times one body's read may time out on
	// the rate deadline and be read again with a fresh BodyGrace (see
	// readDeadline.retry). It bounds what a trickling client gains to
	// about maxStallRetries × BodyGrace.
	maxStallRetries = 2
)

// Envelope reads AdmissionReview bodies under bounds that hold whatever a
// client declares or how slowly it sends: a body is read through
// http.MaxBytesReader into pooled buffers that grow only with bytes
// received; the bytes held by all in-flight bodies share one budget; and the
// body must arrive within the request timeout. The zero value is not usable:
// build one with NewEnvelope. An Envelope is safe for concurrent use.
type Envelope struct {
	maxBody  int64
	timeout  time.Duration
	wait     time.Duration
	inflight int64
	budget   *semaphore.Weighted
}

// EnvelopeOptions sizes an Envelope; zero fields take the defaults above.
type EnvelopeOptions struct {
	// MaxBody is the largest body accepted, in bytes.
	MaxBody int64
	// MaxInflight bounds the buffer bytes held by all requests being
	// served at once, in bytes.
	MaxInflight int64
	// Timeout bounds reading one body; see Envelope.Deadline.
	Timeout time.Duration
	// BudgetWait is how long a body may wait for MaxInflight room.
	BudgetWait time.Duration
}

// NewEnvelope returns an Envelope with o's bounds.
func NewEnvelope(o EnvelopeOptions) *Envelope {
	e := &Envelope{maxBody: o.MaxBody, timeout: o.Timeout, wait: o.BudgetWait, inflight: o.MaxInflight}
	if e.maxBody <= 0 {
		e.maxBody = DefaultMaxBody
	}
	if e.timeout <= 0 {
		e.timeout = DefaultTimeout
	}
	if e.wait <= 0 {
		e.wait = defaultBudgetWait
	}
	if e.inflight <= 0 {
		e.inflight = DefaultMaxInflight
	}
	// A single body must always fit, or a large valid review could never
	// be served.
	if e.inflight < e.maxBody {
		e.inflight = e.maxBody
	}
	e.budget = semaphore.NewWeighted(e.inflight)
	return e
}

// defaultEnvelope is the process-wide Envelope with the default bounds,
// for handlers not given one.
var defaultEnvelope = sync.OnceValue(func() *Envelope { return NewEnvelope(EnvelopeOptions{}) })

// deadline is when the body of r must have arrived: the request start plus
// the smaller of the envelope's timeout and the timeout the API server
// passes as the "timeout" query parameter (the webhook's timeoutSeconds,
// rounded up to a second: k8s.io/apiserver admission/plugin/webhook
// mutating dispatcher via client-go rest.Request.Timeout). A caller cannot
// extend the envelope's timeout.
func (e *Envelope) deadline(r *http.Request, start time.Time) time.Time {
	d := e.timeout
	if r.URL == nil {
		return start.Add(d)
	}
	if q := r.URL.Query().Get("timeout"); q != "" {
		if t, err := time.ParseDuration(q); err == nil && t > 0 && t < d {
			d = t
		}
	}
	return start.Add(d)
}

// BodyError is a body the envelope refused. Status is the HTTP status to
// answer with (413, 408, 429 or 400) and Reason a short fixed token for
// metrics: TooLarge, Timeout, Busy or Read.
type BodyError struct {
	Status int
	Reason string
	Msg    string
}

func (e *BodyError) Error() string { return e.Msg }

// body reasons.
const (
	ReasonTooLarge = "TooLarge"
	ReasonTimeout  = "Timeout"
	ReasonBusy     = "Busy"
	ReasonRead     = "Read"
)

// Body is a request body read by an Envelope. Its bytes are valid until
// Release, which returns the buffer to its pool and its bytes to the
// budget; call Release once, when the response is written.
type Body struct {
	e    *Envelope
	buf  []byte
	box  *pooled // buf's pool entry, reused so a Put allocates nothing
	held int64
	// retried counts reads that timed out on the rate deadline and were
	// read again (readDeadline.retry); deadline is the request's.
	retried  int
	deadline time.Time
}

// Retried is how many of the body's reads timed out on the rate deadline
// and then got bytes when read again: the server, not the client, had
// stalled. net/http cancels the request's context on any read error
// (connReader.handleReadErrorLocked), so Serve gives such a request a
// context of its own that ends at Deadline.
func (b *Body) Retried() int { return b.retried }

// Deadline is the request's deadline: the envelope's timeout, or the
// shorter timeout the API server sent.
func (b *Body) Deadline() time.Time { return b.deadline }

// bytes is the body.
func (b *Body) bytes() []byte { return b.buf }

// Release returns the buffer and its budget. It is safe on a nil body.
func (b *Body) Release() {
	if b == nil || b.e == nil {
		return
	}
	putBuf(b.box, b.buf)
	b.e.budget.Release(b.held)
	b.buf, b.box, b.held, b.e = nil, nil, 0, nil
}

// Buffer size classes. A body starts in the smallest and moves up only when
// it has filled its buffer, so what a request holds is at most twice what it
// has sent (plus 16 KiB). Classes above 1 MiB are not pooled: bodies that
// large are rare and pooling them would keep megabytes alive between GCs.
var classes = [...]int{16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20}

var pools [len(classes)]sync.Pool

type pooled struct{ b []byte }

// getBuf returns an empty buffer of capacity size in its pool entry.
func getBuf(size int) *pooled {
	for i, c := range classes {
		if c == size {
			if p, ok := pools[i].Get().(*pooled); ok {
				p.b = p.b[:0]
				return p
			}
			return &pooled{b: make([]byte, 0, c)}
		}
	}
	return &pooled{b: make([]byte, 0, size)}
}

// putBuf returns b, held in entry p, to its class's pool.
func putBuf(p *pooled, b []byte) {
	if p == nil {
		return
	}
	for i, c := range classes {
		if cap(b) == c {
			p.b = b[:0]
			pools[i].Put(p)
			return
		}
	}
}

// nextSize is the buffer capacity after cur is full: the next class, then
// doubling, never above max.
func nextSize(cur int, max int64) int {
	n := cur * 2
	for _, c := range classes {
		if c > cur {
			n = c
			break
		}
	}
	if int64(n) > max {
		n = int(max)
	}
	return n
}

// Read reads r's body under the envelope's bounds. It never allocates from
// the declared Content-Length: a declared length above MaxBody is refused
// at once, and otherwise the buffer grows with the bytes that arrive. The
// connection's read deadline (set through http.ResponseController;
// recorders that do not support it get none) is Deadline, and earlier for a
// body slower than minBodyRate after BodyGrace, so a slow body ends with 408
// and the connection is closed. When the in-flight budget is full for longer
// than the budget wait, the body is refused with 429. On success the caller
// must Release the body.
func (e *Envelope) Read(w http.ResponseWriter, r *http.Request) (*Body, error) {
	start := time.Now()
	if r.ContentLength > e.maxBody {
		return nil, &BodyError{Status: http.StatusRequestEntityTooLarge, Reason: ReasonTooLarge,
			Msg: fmt.Sprintf("body of %d bytes exceeds the %d byte limit", r.ContentLength, e.maxBody)}
	}
	deadline := e.deadline(r, start)
	rd := readDeadline{rc: http.NewResponseController(w), start: start, last: start, deadline: deadline}
	// Not http.MaxBytesReader: its errors are sticky, and a read that timed
	// out must be readable again (readDeadline.retry). The buffer never
	// grows past maxBody, and a full buffer's one-byte read tells the end
	// from an excess.
	src := r.Body
	b := &Body{e: e, deadline: deadline}
	ctx := r.Context()
	for {
		rd.set(len(b.buf))
		if len(b.buf) == cap(b.buf) {
			if int64(cap(b.buf)) >= e.maxBody {
				// Full at the limit: the next read tells EOF from excess.
				var one [1]byte
				n, err := src.Read(one[:])
				rd.last = time.Now()
				if n == 0 && errors.Is(err, io.EOF) {
					return b, nil
				}
				if n == 0 && err == nil {
					continue
				}
				b.Release()
				return nil, e.readError(err, n > 0, &rd)
			}
			if err := e.grow(ctx, b, deadline); err != nil {
				b.Release()
				return nil, err
			}
		}
		stallHook()
		n, err := src.Read(b.buf[len(b.buf):cap(b.buf)])
		rd.last = time.Now()
		b.buf = b.buf[:len(b.buf)+n]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil && rd.retry(err, len(b.buf)) {
			b.retried++
			ctx = context.WithoutCancel(ctx)
			continue
		}
		if err != nil {
			b.Release()
			return nil, e.readError(err, false, &rd)
		}
	}
}

// readDeadline moves the connection's read deadline as bytes arrive: the
// next byte is due by start + BodyGrace + received/minBodyRate, never
// later than the request deadline. Once the body is in, net/http clears the
// deadline for its background read (connReader.startBackgroundRead), so a
// review that takes longer to answer keeps its context.
type readDeadline struct {
	rc *http.ResponseController
	// start is when the client's allowance began: the body's start,
	// moved on by the time this server itself spent between reads.
	start time.Time
	// last is when the previous read returned (the body's start at first).
	last        time.Time
	deadline    time.Time
	cur         time.Time
	unsupported bool
	// retries counts the rate-deadline timeouts read again (retry).
	retries int
}

// set moves the connection's read deadline for the next read. The time
// between one read's return and the next read is the server's
// own (copying, growing the buffer, or stalled: CPU starvation, a GC
// pause), not the client's, so it moves start on. Charged to the client,
// a stall of a second would set a deadline already past, and the poller
// refuses a read past its deadline before looking at the socket: every
// body in flight, already received, would be refused with 408.
func (d *readDeadline) set(received int) {
	if d.unsupported {
		return
	}
	t := d.next(time.Now(), received)
	// Skip moves under 10 ms: each is a timer update on the connection.
	if !d.cur.IsZero() && t.Sub(d.cur) < 10*time.Millisecond {
		return
	}
	// ErrNotSupported (a test recorder) leaves the server's ReadTimeout.
	if err := d.rc.SetReadDeadline(t); err != nil {
		d.unsupported = true
		return
	}
	d.cur = t
}

// stallHook runs after a read's deadline is set and before the read: tests
// stall the server there, as CPU starvation does.
var stallHook = func() {}

// retry reports whether a read that failed with err is read again. A
// read times out on the rate deadline whenever this process did not run
// between the bytes' arrival and the deadline (a CPU-starved node, a GC
// pause): Go's poller wakes the reader with the timeout, not the data
// (internal/poll, runtime netpoll), and a body already in the socket
// buffer would be refused with 408. So the first maxStallRetries such
// timeouts of a body grant a fresh BodyGrace from now and read again; a
// client that really trickles still ends with 408, about
// maxStallRetries × BodyGrace later. crypto/tls keeps a connection usable
// after a timeout (a temporary net.Error). The request's own deadline is
// never retried.
func (d *readDeadline) retry(err error, received int) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) || d.retries >= maxStallRetries {
		return false
	}
	now := time.Now()
	if !d.cur.IsZero() && !d.cur.Before(d.deadline) || !now.Before(d.deadline) {
		return false
	}
	d.retries++
	d.start = now.Add(-time.Duration(int64(received) * int64(time.Second) / minBodyRate))
	d.last = now
	return true
}

// next is the deadline of the next read, issued at now with received
// bytes in: start + BodyGrace + received/minBodyRate, never later than the
// request deadline, with start first moved on by the time since the
// previous read returned (the server's own).
func (d *readDeadline) next(now time.Time, received int) time.Time {
	if now.After(d.last) {
		d.start = d.start.Add(now.Sub(d.last))
		d.last = now
	}
	t := d.start.Add(BodyGrace + time.Duration(int64(received)*int64(time.Second)/minBodyRate))
	if t.After(d.deadline) {
		t = d.deadline
	}
	return t
}

// grow moves b to the next buffer size, taking the difference from the
// budget first.
func (e *Envelope) grow(ctx context.Context, b *Body, deadline time.Time) error {
	size := nextSize(cap(b.buf), e.maxBody)
	need := int64(size) - b.held
	if !e.budget.TryAcquire(need) {
		wait := time.Now().Add(e.wait)
		if deadline.Before(wait) {
			wait = deadline
		}
		wctx, cancel := context.WithDeadline(ctx, wait)
		err := e.budget.Acquire(wctx, need)
		cancel()
		if err != nil {
			return &BodyError{Status: http.StatusTooManyRequests, Reason: ReasonBusy,
				Msg: fmt.Sprintf("server busy: request bodies in flight hold the %d byte limit; retry", e.inflight)}
		}
	}
	nb := getBuf(size)
	nb.b = append(nb.b, b.buf...)
	putBuf(b.box, b.buf)
	b.box, b.buf = nb, nb.b
	b.held += need
	return nil
}

func (e *Envelope) readError(err error, excess bool, rd *readDeadline) error {
	var mbe *http.MaxBytesError
	switch {
	case excess || errors.As(err, &mbe):
		return &BodyError{Status: http.StatusRequestEntityTooLarge, Reason: ReasonTooLarge,
			Msg: fmt.Sprintf("body exceeds the %d byte limit", e.maxBody)}
	case errors.Is(err, os.ErrDeadlineExceeded) && rd.cur.Before(rd.deadline):
		return &BodyError{Status: http.StatusRequestTimeout, Reason: ReasonTimeout,
			Msg: fmt.Sprintf("body too slow: after %v it must arrive at %d KiB/s or more", BodyGrace, minBodyRate>>10)}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &BodyError{Status: http.StatusRequestTimeout, Reason: ReasonTimeout,
			Msg: fmt.Sprintf("body not received within the request timeout of %v", rd.deadline.Sub(rd.start).Round(time.Millisecond))}
	}
	return &BodyError{Status: http.StatusBadRequest, Reason: ReasonRead, Msg: "reading body: " + err.Error()}
}

// Fail writes a bodyError (or any error, as 400) as a plain-text answer.
// A 408 or 413 also closes the connection: the rest of the body is never
// read.
func Fail(w http.ResponseWriter, err error) {
	var be *BodyError
	if !errors.As(err, &be) {
		be = &BodyError{Status: http.StatusBadRequest, Reason: ReasonRead, Msg: err.Error()}
	}
	if be.Status == http.StatusRequestTimeout || be.Status == http.StatusRequestEntityTooLarge {
		w.Header().Set("Connection", "close")
	}
	http.Error(w, be.Msg, be.Status)
}
