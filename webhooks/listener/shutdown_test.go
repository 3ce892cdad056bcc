package listener_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hookwright/hookwright/webhooks/listener"
	"github.com/hookwright/hookwright/webhooks/serving/servingtest"
)

// call posts to url and reports the status, whether the answer asked to
// close the connection, and whether the client reused a pooled connection.
func call(t *testing.T, c *http.Client, url string) (status int, closed, reused bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req = req.WithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("call during the drain failed: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Close, reused
}

// The shutdown sequence, stepped by DrainDone rather than by time: when
// the context ends readiness fails at once while the server keeps
// answering, on the pooled keep-alive connection and on new ones, each
// answer closing its connection so the client moves; when the drain ends
// the listener closes while a review in flight still gets its answer.
func TestShutdownDrainsThenFinishesInFlight(t *testing.T) {
	drainDone := make(chan struct{})
	entered, release := make(chan struct{}), make(chan struct{})
	o := listener.Options{DrainPeriod: time.Hour, DrainDone: drainDone}
	e := o.Envelope()
	s := servingtest.Start(t, o, func(srv *listener.Server) {
		srv.Register("/echo", echo(e))
		srv.Register("/block", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			_, _ = io.WriteString(w, "late")
		}))
	})
	var dials atomic.Int32
	tr := &http.Transport{
		TLSClientConfig: s.ClientTLS.Clone(), MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	if st, closed, _ := call(t, client, s.URL("/echo")); st != http.StatusOK || closed {
		t.Fatalf("before the drain: status %d, close %v; want 200 on a kept connection", st, closed)
	}
	// A review in flight across the whole shutdown, on its own connection.
	inflight := make(chan string, 1)
	go func() {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: s.ClientTLS.Clone()}, Timeout: time.Minute}
		resp, err := c.Post(s.URL("/block"), "application/json", strings.NewReader("{}"))
		if err != nil {
			inflight <- "error: " + err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		inflight <- string(b)
	}()
	<-entered

	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop() }()
	for !s.Draining() {
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.StartedChecker()(nil); err == nil {
		t.Fatal("readiness passes while draining")
	}

	// The pooled connection is still served, and told to close.
	st, closed, reused := call(t, client, s.URL("/echo"))
	if st != http.StatusOK || !closed || !reused {
		t.Fatalf("pooled call while draining: status %d, close %v, reused %v; want 200, close, reused", st, closed, reused)
	}
	// The next call dials anew (a replacement would answer it in a
	// cluster) and is served too.
	st, closed, reused = call(t, client, s.URL("/echo"))
	if st != http.StatusOK || !closed || reused {
		t.Fatalf("new call while draining: status %d, close %v, reused %v; want 200, close, new connection", st, closed, reused)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2: one before the drain, one after the pooled connection closed", n)
	}

	close(drainDone)
	// The listener closes while the review in flight still runs.
	for {
		c, err := tls.Dial("tcp", s.Addr, s.ClientTLS)
		if err != nil {
			break
		}
		_ = c.Close()
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-stopped:
		t.Fatalf("server stopped (%v) with a review in flight", err)
	default:
	}
	close(release)
	if got := <-inflight; got != "late" {
		t.Fatalf("in-flight review got %q, want its answer", got)
	}
	if err := <-stopped; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("server: %v", err)
	}
}

// The drain period's defaults and the bound a pod's grace period must meet.
func TestShutdownBound(t *testing.T) {
	for _, c := range []struct {
		o    listener.Options
		want time.Duration
	}{
		{listener.Options{}, 31 * time.Second},
		{listener.Options{DrainPeriod: listener.DefaultDrainPeriod}, listener.DefaultDrainPeriod + 31*time.Second},
		{listener.Options{DrainPeriod: -1, RequestTimeout: 10 * time.Second}, 11 * time.Second},
		{listener.Options{DrainPeriod: 2 * time.Second, RequestTimeout: 10 * time.Second}, 13 * time.Second},
	} {
		if got := c.o.ShutdownBound(); got != c.want {
			t.Errorf("%+v: bound %v, want %v", c.o, got, c.want)
		}
	}
}
