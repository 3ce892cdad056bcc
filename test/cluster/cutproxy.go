package cluster

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// CutProxy relays TCP connections to one address (the API server) so that
// a test can fault one client's traffic at a point it knows: once armed,
// when the bytes relayed from the server pass a threshold it holds every
// connection (nothing more reaches the client, while what the client sends
// still reaches the server), until Release closes them all, as a server
// that went away would. TLS stays end to end: it relays bytes only.
//
// The pod sweep (test/scale) puts one between an operator replica and
// kube-apiserver, with the threshold half its pod list, to kill the
// replica or restart the server in the middle of its initial sync.
type CutProxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	limit   int64 // 0: not armed
	sent    int64 // server-to-client bytes since Arm (or the start)
	holding bool  // from the threshold until Release
	held    chan struct{}
	release chan struct{}
	down    bool // after Release(true): new connections are closed at once
	closed  bool

	wg sync.WaitGroup
}

// NewCutProxy listens on a free port of 127.0.0.1 and relays to target
// (host:port).
func NewCutProxy(target string) (*CutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &CutProxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}, held: make(chan struct{}), release: make(chan struct{})}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Arm counts the bytes the server sends from now on and holds every
// connection once they pass limit (bytes, more than 0). A proxy holds
// once: arm it once.
func (p *CutProxy) Arm(limit int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limit, p.sent = limit, 0
}

// Sent is how many bytes the server sent since Arm, or since the proxy
// started when it was never armed.
func (p *CutProxy) Sent() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent
}

// Held is closed once the threshold was passed and the connections held.
func (p *CutProxy) Held() <-chan struct{} { return p.held }

// Release closes every connection, held or not. With down, connections
// made later are closed at once (a server that stays away); without, they
// are relayed and nothing is counted any more.
func (p *CutProxy) Release(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.limit, p.holding = down, 0, false
	select {
	case <-p.release:
	default:
		close(p.release)
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// Close stops listening, closes every connection and waits for the relays.
func (p *CutProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Release(true)
	p.wg.Wait()
	return err
}

// Kubeconfig writes a copy of the kubeconfig at src whose clusters all
// point at the proxy (the API server's certificate names 127.0.0.1, so
// TLS verifies as before) and returns its path, in t's temporary
// directory.
func (p *CutProxy) Kubeconfig(t testing.TB, src string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + p.Addr()
	}
	dst := filepath.Join(t.TempDir(), "kubeconfig-cutproxy")
	// WriteToFile writes it 0600: it holds the admin's credentials.
	if err := clientcmd.WriteToFile(*cfg, dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

func (p *CutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.relay(c) })
	}
}

func (p *CutProxy) relay(c net.Conn) {
	defer p.forget(c)
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.conns[u] = struct{}{}
	p.mu.Unlock()
	defer p.forget(u)
	p.wg.Go(func() {
		_, _ = io.Copy(u, c)
		closeWrite(u)
	})
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 {
			pass := p.admit(int64(n))
			if _, werr := c.Write(buf[:pass]); werr != nil {
				return
			}
			if pass < int64(n) {
				<-p.release
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				closeWrite(c)
			}
			return
		}
	}
}

// admit says how many of n bytes from the server may reach the client:
// all of them until the armed threshold, none once held.
func (p *CutProxy) admit(n int64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holding {
		return 0
	}
	if p.limit == 0 {
		p.sent += n
		return n
	}
	if p.sent+n <= p.limit {
		p.sent += n
		return n
	}
	pass := p.limit - p.sent
	p.sent, p.holding = p.limit, true
	select {
	case <-p.held:
	default:
		close(p.held)
	}
	return pass
}

func (p *CutProxy) forget(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}
