package serving

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"sync"
)

// Reasons of requests refused before their body is read.
const (
	ReasonMethod      = "Method"
	ReasonContentType = "ContentType"
)

// Refuse returns the *bodyError that answers a request with status, a short
// fixed reason token for metrics and a plain-text message.
func Refuse(status int, reason, msg string) *BodyError {
	return &BodyError{Status: status, Reason: reason, Msg: msg}
}

// ReviewFunc answers one AdmissionReview body, appending the JSON of the
// response AdmissionReview to dst (a pooled buffer; body and dst are valid
// only during the call). A *bodyError it returns is the answer (its status
// and message, e.g. 400 for a body that is not a review, 503 while no
// configuration is loaded); any other error is a 400.
type ReviewFunc func(r *http.Request, body, dst []byte) ([]byte, error)

// Serve is the HTTP skeleton both webhook servers answer with. It refuses
// what the API server never sends (a method other than POST: 405; a content
// type other than application/json: 415), reads the body under e's bounds
// (413, 408, 429 or 400: Envelope.Read), then hands it to review and writes
// what review appended as a 200 application/json answer. A refused request
// gets a plain-text answer (Fail) and is returned, for the caller's metrics
// and log; a request answered 200 returns nil. The API server treats a
// non-200 as a failed call and applies the webhook's failurePolicy, which
// is right for garbage (k8s.io/apiserver pkg/admission/plugin/webhook/
// request). A nil e is the process-wide Envelope with the default bounds.
func Serve(w http.ResponseWriter, r *http.Request, e *Envelope, review ReviewFunc) *BodyError {
	if e == nil {
		e = defaultEnvelope()
	}
	if r.Method != http.MethodPost {
		return refuse(w, Refuse(http.StatusMethodNotAllowed, ReasonMethod, "method "+r.Method+" not allowed: POST an AdmissionReview"))
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return refuse(w, Refuse(http.StatusUnsupportedMediaType, ReasonContentType,
			fmt.Sprintf("content type %q not supported: want application/json", r.Header.Get("Content-Type"))))
	}
	body, err := e.Read(w, r)
	if err != nil {
		return refuse(w, err)
	}
	defer body.Release()
	if body.Retried() > 0 {
		// The timed-out read cancelled the request's context; the review
		// still has until the request's deadline. The connection is
		// closed after the answer, as net/http expects of a read error.
		ctx, cancel := context.WithDeadline(context.WithoutCancel(r.Context()), body.Deadline())
		defer cancel()
		r = r.WithContext(ctx)
		w.Header().Set("Connection", "close")
	}
	out := outPool.Get().(*outBuf)
	defer putOut(out)
	answer, err := review(r, body.bytes(), out.b[:0])
	if err != nil {
		return refuse(w, err)
	}
	out.b = answer // keep what it grew to
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(answer)
	return nil
}

// refuse answers err (Fail) and returns it as a *bodyError.
func refuse(w http.ResponseWriter, err error) *BodyError {
	var be *BodyError
	if !errors.As(err, &be) {
		be = Refuse(http.StatusBadRequest, ReasonRead, err.Error())
	}
	Fail(w, be)
	return be
}

// Answers are built in pooled buffers: an oversell answer is a few hundred
// bytes, an injection patch a few KiB. Buffers that grew past maxPooledOut
// (a patch for a very large pod) are left to the garbage collector rather
// than kept alive between requests.
const maxPooledOut = 64 << 10

type outBuf struct{ b []byte }

var outPool = sync.Pool{New: func() any { return &outBuf{b: make([]byte, 0, 2048)} }}

func putOut(o *outBuf) {
	if cap(o.b) <= maxPooledOut {
		outPool.Put(o)
	}
}
