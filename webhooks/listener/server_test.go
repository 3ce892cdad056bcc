package listener_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hookwright/hookwright/webhooks/listener"
	"github.com/hookwright/hookwright/webhooks/serving"
	"github.com/hookwright/hookwright/webhooks/serving/servingtest"
)

// echo reads the body through the envelope and answers its length.
func echo(e *serving.Envelope) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := e.Read(w, r)
		if err != nil {
			serving.Fail(w, err)
			return
		}
		defer b.Release()
		_, _ = io.WriteString(w, "ok")
	})
}

func start(t *testing.T, o listener.Options) *servingtest.Server {
	e := o.Envelope()
	return servingtest.Start(t, o, func(s *listener.Server) {
		s.Register("/echo", echo(e))
		s.Register("/slow", slowAnswer(e, serving.BodyGrace+time.Second))
	})
}

// slowAnswer reads the body, then takes d to answer, and tells whether the
// request's context was still live.
func slowAnswer(e *serving.Envelope, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := e.Read(w, r)
		if err != nil {
			serving.Fail(w, err)
			return
		}
		defer b.Release()
		select {
		case <-time.After(d):
			_, _ = io.WriteString(w, "live")
		case <-r.Context().Done():
			_, _ = io.WriteString(w, "canceled")
		}
	})
}

// A review that takes longer than BodyGrace to answer keeps its context: a
// read deadline firing in net/http's background read would cancel it, so
// the body's rate deadline must not outlive the body (net/http clears it
// when the body reaches EOF; this guards that the envelope relies on).
func TestSlowAnswerKeepsContext(t *testing.T) {
	s := start(t, listener.Options{})
	resp, err := s.Client(30*time.Second).Post(s.URL("/slow"), "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(b) != "live" {
		t.Fatalf("got %d %q, want live", resp.StatusCode, b)
	}
}

func dial(t *testing.T, s *servingtest.Server, protos ...string) *tls.Conn {
	t.Helper()
	cfg := s.ClientTLS.Clone()
	cfg.NextProtos = protos
	c, err := tls.Dial("tcp", s.Addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readAll reads what the server sends until it closes the connection, and
// fails the test if that takes longer than limit.
func readAll(t *testing.T, c *tls.Conn, limit time.Duration) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	b, err := io.ReadAll(c)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("server kept the connection open: %v (read %q)", err, b)
	}
	return string(b)
}

// A body that stops arriving is cut at the request timeout with 408 and the
// connection closed; controller-runtime's server kept such connections open
// for as long as the client liked.
func TestSlowBodyTimesOut(t *testing.T) {
	s := start(t, listener.Options{RequestTimeout: time.Second})
	c := dial(t, s)
	if _, err := io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3145728\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, c, 20*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 408") && got != "" {
		t.Fatalf("got %q, want a 408 or a closed connection", got)
	}
}

// The API server's timeout parameter shortens the body deadline.
func TestSlowBodyTimeoutParameter(t *testing.T) {
	s := start(t, listener.Options{RequestTimeout: time.Hour})
	c := dial(t, s)
	if _, err := io.WriteString(c, "POST /echo?timeout=1s HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c, 20*time.Second); !strings.HasPrefix(got, "HTTP/1.1 408") {
		t.Fatalf("got %q, want 408", got)
	}
}

func TestSlowHeadersTimeOut(t *testing.T) {
	s := start(t, listener.Options{RequestTimeout: time.Second})
	c := dial(t, s)
	if _, err := io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	readAll(t, c, 20*time.Second)
}

func TestIdleConnectionClosed(t *testing.T) {
	s := start(t, listener.Options{RequestTimeout: time.Second, IdleTimeout: time.Second})
	c := dial(t, s)
	if _, err := io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	_ = resp.Body.Close()
	readAll(t, c, 20*time.Second)
}

// HTTP/2 stays off unless enabled: a client offering only h2 is refused at
// the handshake, one offering both gets HTTP/1.1.
func TestHTTP2Off(t *testing.T) {
	s := start(t, listener.Options{})
	if p := dial(t, s, "h2", "http/1.1").ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Fatalf("negotiated %q, want http/1.1", p)
	}
	cfg := s.ClientTLS.Clone()
	cfg.NextProtos = []string{"h2"}
	if c, err := tls.Dial("tcp", s.Addr, cfg); err == nil {
		p := c.ConnectionState().NegotiatedProtocol
		_ = c.Close()
		if p == "h2" {
			t.Fatal("h2 negotiated with HTTP/2 disabled")
		}
	}
	resp, err := s.Client(10*time.Second).Post(s.URL("/echo"), "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.ProtoMajor != 1 {
		t.Fatalf("served %s", resp.Proto)
	}
}

func TestHTTP2On(t *testing.T) {
	s := start(t, listener.Options{EnableHTTP2: true})
	if p := dial(t, s, "h2", "http/1.1").ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q with --enable-http2, want h2", p)
	}
}

func TestStartedChecker(t *testing.T) {
	o := listener.Options{MinTLSVersion: "1.3"}
	srv, err := o.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.StartedChecker()(nil); err == nil {
		t.Fatal("checker passed before Start")
	}
	s := start(t, listener.Options{})
	if err := s.StartedChecker()(nil); err != nil {
		t.Fatal(err)
	}
}

// A body that keeps trickling (one byte every 50 ms) is cut soon after
// BodyGrace even under a long request timeout: it must not hold its
// buffer and budget for the whole timeout.
func TestTrickledBodyCutByRate(t *testing.T) {
	s := start(t, listener.Options{RequestTimeout: time.Hour})
	c := dial(t, s)
	if _, err := io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3145728\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		// Not readAll: a test may not fail from another goroutine.
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case g := <-got:
			if !strings.HasPrefix(g, "HTTP/1.1 408") || !strings.Contains(g, "too slow") {
				t.Fatalf("got %q, want 408 body too slow", g)
			}
			return
		case <-tick.C:
			_, _ = io.WriteString(c, "x")
		}
	}
}
