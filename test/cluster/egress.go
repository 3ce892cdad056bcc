package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// EgressProxy is an HTTP CONNECT proxy on a unix socket. kube-apiserver sends
// its "cluster" egress traffic (webhook calls, service proxy) through it, as
// configured by an EgressSelectorConfiguration with proxyProtocol HTTPConnect
// (KEP-1281, network proxy). The CONNECT target is a Service's ClusterIP:port;
// the proxy maps it to a local address where a test runs the real server, and
// then only relays bytes, so TLS stays end to end.
//
// Targets without a mapping go to the dialer set by SetDialer (the
// cluster's: real nodes' Services, pods and kubelets); without one, or when
// it answers ErrNoRoute, they are refused with 502.
type EgressProxy struct {
	socket string
	ln     net.Listener
	dial   func(target string) (net.Conn, error)

	mu     sync.RWMutex
	routes map[string]string // "10.0.0.12:443" -> "127.0.0.1:39011"
	hits   map[string]int
	// cut are the last maxCut relays the target ended abnormally.
	cut []string

	wg     sync.WaitGroup
	closed chan struct{}
}

// NewEgressProxy listens on the unix socket path (at most 107 bytes long).
func NewEgressProxy(socket string) (*EgressProxy, error) {
	_ = os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: listen on %s: %w", socket, err)
	}
	p := &EgressProxy{
		socket: socket,
		ln:     ln,
		routes: map[string]string{},
		hits:   map[string]int{},
		closed: make(chan struct{}),
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Socket is the unix socket path to put in the EgressSelectorConfiguration.
func (p *EgressProxy) Socket() string { return p.socket }

// Route maps target (host:port as the API server sends it in CONNECT) to local.
func (p *EgressProxy) Route(target, local string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.routes[target] = local
}

// SetDialer sets how unmapped targets are dialled; call it before the API
// server sends traffic. A dialer returns ErrNoRoute for targets it refuses.
func (p *EgressProxy) SetDialer(dial func(target string) (net.Conn, error)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dial = dial
}

// Unroute removes a mapping; later CONNECTs to target get 502.
func (p *EgressProxy) Unroute(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.routes, target)
}

// Hits is the number of CONNECTs seen for target, mapped or not.
func (p *EgressProxy) Hits(target string) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.hits[target]
}

// Close stops accepting and waits for relays to end.
func (p *EgressProxy) Close() error {
	select {
	case <-p.closed:
		return nil
	default:
	}
	close(p.closed)
	err := p.ln.Close()
	p.wg.Wait()
	_ = os.Remove(p.socket)
	return err
}

func (p *EgressProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.closed:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *EgressProxy) handle(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
		return
	}
	target := req.Host
	p.mu.Lock()
	p.hits[target]++
	local, ok := p.routes[target]
	dial := p.dial
	p.mu.Unlock()
	var up net.Conn
	switch {
	case ok:
		up, err = net.DialTimeout("tcp", local, 5*time.Second)
	case dial != nil:
		up, err = dial(target)
	default:
		err = ErrNoRoute
	}
	if errors.Is(err, ErrNoRoute) {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent right after CONNECT may sit in br's buffer.
	if n := br.Buffered(); n > 0 {
		buf, _ := br.Peek(n)
		if _, err := up.Write(buf); err != nil {
			return
		}
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() {
		n, err := io.Copy(c, up)
		if err != nil || n == 0 {
			p.noteCut(target, n, err)
		}
		closeWrite(c)
		done <- struct{}{}
	}()
	select {
	case <-done:
		<-done
	case <-p.closed:
	}
}

// maxCut bounds what Cut keeps.
const maxCut = 20

// noteCut records a relay whose target reset it (err) or closed it
// without sending a byte. The API server sees either as a clean EOF, so
// the proxy's record is what tells a server's reset from its close.
func (p *EgressProxy) noteCut(target string, n int64, err error) {
	what := "closed before sending a byte"
	if err != nil {
		what = fmt.Sprintf("ended with %v after %d bytes", err, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = append(p.cut, time.Now().Format("15:04:05.000")+" "+target+" "+what)
	if len(p.cut) > maxCut {
		p.cut = p.cut[len(p.cut)-maxCut:]
	}
}

// Cut are the last relays (at most 20) whose target reset them or closed
// them before sending a byte, oldest first, one line each with the time.
func (p *EgressProxy) Cut() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]string(nil), p.cut...)
}

func closeWrite(c net.Conn) {
	type cw interface{ CloseWrite() error }
	if w, ok := c.(cw); ok {
		_ = w.CloseWrite()
	}
}

// egressSelectorConfig sends the API server's "cluster" egress to the
// proxy on socket (EgressSelectorConfiguration, KEP-1281).
func egressSelectorConfig(socket string) string {
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: ` + socket + `
`
}
