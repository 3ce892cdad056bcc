package listener_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/hookwright/hookwright/webhooks/listener"
)

// post sends one /echo request on c and returns the status line, or the
// error reading the answer.
func post(c *tls.Conn) (string, error) {
	if _, err := io.WriteString(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Status, nil
}

// A connection's first request may come as long after its handshake as a
// later request after the previous answer (IdleTimeout), not only within
// the request timeout: the API server pools connections it dialed but did
// not use, and net/http closed those at the request timeout, failing the
// request the API server sent on one in that instant (firstRequestListener).
func TestFirstRequestGetsTheIdleTimeout(t *testing.T) {
	const reqTimeout = time.Second
	s := start(t, listener.Options{RequestTimeout: reqTimeout, IdleTimeout: time.Minute})
	fresh, used := dial(t, s), dial(t, s)
	if got, err := post(used); err != nil || got != "200 OK" {
		t.Fatalf("first request at once: %q, %v", got, err)
	}
	// Both idle three request timeouts: the server must keep both.
	time.Sleep(3 * reqTimeout)
	for name, c := range map[string]*tls.Conn{"never used": fresh, "used once": used} {
		if got, err := post(c); err != nil || got != "200 OK" {
			t.Errorf("%s, request after 3x the request timeout: %q, %v", name, got, err)
		}
	}
}

// The idle allowance ends the same way for a connection that never sends
// a request, and a request's header, once begun, is still bounded by the
// request timeout (slowloris).
func TestFirstRequestBounds(t *testing.T) {
	s := start(t, listener.Options{RequestTimeout: time.Second, IdleTimeout: 2 * time.Second})
	silent, slow := dial(t, s), dial(t, s)
	if _, err := io.WriteString(slow, "POST /echo HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	// Each is closed by the server; the client's own deadline only keeps
	// a broken server from hanging the test.
	for name, c := range map[string]*tls.Conn{"silent": silent, "header begun, never ended": slow} {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := c.Read(make([]byte, 1))
		var ne interface{ Timeout() bool }
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s: read %v, want the server to close the connection", name, err)
		}
	}
}
