package cluster

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func connect(t *testing.T, socket, target, extra string) (net.Conn, *http.Response, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// The request and the first tunnelled bytes in one write, as a client
	// that pipelines would send them.
	if _, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"+extra); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return c, res, br
}

// proxyTo starts an EgressProxy with target routed to a local listener
// whose i-th accepted connection goes to serve; both stop with the test.
func proxyTo(t *testing.T, target string, serve func(i int, c net.Conn)) *EgressProxy {
	t.Helper()
	p, err := NewEgressProxy(filepath.Join(t.TempDir(), "e.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serve(i, c)
		}
	}()
	p.Route(target, ln.Addr().String())
	return p
}

func TestEgressProxyRoutesAndRefuses(t *testing.T) {
	// An echo server standing in for a webhook.
	p := proxyTo(t, "10.0.0.9:443", func(_ int, c net.Conn) {
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	})

	c, res, br := connect(t, p.Socket(), "10.0.0.9:443", "early-")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("mapped CONNECT: status %d", res.StatusCode)
	}
	if _, err := io.WriteString(c, "bytes\n"); err != nil {
		t.Fatal(err)
	}
	line, err := br.ReadString('\n')
	if err != nil || line != "early-bytes\n" {
		t.Fatalf("relay = %q, %v; want bytes sent with and after CONNECT", line, err)
	}

	_, res, _ = connect(t, p.Socket(), "10.0.0.10:443", "")
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("unmapped CONNECT: status %d, want 502 (the proxy must never dial it)", res.StatusCode)
	}
	if p.Hits("10.0.0.10:443") != 1 || p.Hits("10.0.0.9:443") != 1 {
		t.Fatalf("hits = %d/%d", p.Hits("10.0.0.9:443"), p.Hits("10.0.0.10:443"))
	}

	p.Unroute("10.0.0.9:443")
	_, res, _ = connect(t, p.Socket(), "10.0.0.9:443", "")
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("after Unroute: status %d, want 502", res.StatusCode)
	}

	c2, err := net.Dial("unix", p.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, _ = io.WriteString(c2, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	res2, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || res2.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %v %v, want 405", res2, err)
	}
	if !strings.HasSuffix(p.Socket(), "e.sock") {
		t.Fatal(p.Socket())
	}
}

// TestEgressProxyRecordsCuts: a target that closes a relay without a byte
// or resets it is recorded, since the API server sees both as EOF.
func TestEgressProxyRecordsCuts(t *testing.T) {
	p := proxyTo(t, "10.0.0.9:443", func(i int, c net.Conn) {
		if i == 1 {
			// Once the tunnel's first bytes are in, linger 0: the
			// kernel answers the close with a reset.
			_, _ = c.Read(make([]byte, 1))
			_ = c.(*net.TCPConn).SetLinger(0)
		}
		c.Close()
	})
	for i := 0; i < 2; i++ {
		c, res, br := connect(t, p.Socket(), "10.0.0.9:443", "hello")
		if res.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT %d: status %d", i, res.StatusCode)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("relay %d: read %v, want EOF", i, err)
		}
		c.Close()
	}
	var cut []string
	if _, err := Poll(context.Background(), time.Millisecond, 10*time.Second, "two cuts recorded", func(context.Context) (bool, error) {
		cut = p.Cut()
		return len(cut) == 2, nil
	}); err != nil {
		t.Fatalf("%v: %q", err, cut)
	}
	for _, c := range cut {
		if !strings.Contains(c, "10.0.0.9:443") || !strings.Contains(c, "closed before sending a byte") && !strings.Contains(c, "ended with") {
			t.Fatalf("cut %q", c)
		}
	}
}
