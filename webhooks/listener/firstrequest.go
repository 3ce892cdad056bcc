package listener

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// firstRequestListener completes each connection's TLS handshake and
// waits for its first request byte under the idle timeout before
// net/http sees the connection.
//
// net/http gives a connection's first request only ReadHeaderTimeout to
// start (the request timeout, 30 s by default) and every later one
// IdleTimeout (120 s, above the API server's 90 s). Go's client transport
// pools connections it dialed for a request that another connection
// served first, so the API server holds connections that never carried a
// request; net/http closed those after 30 s, and a request the API
// server sent on one in that instant failed with EOF, never retried: it
// was the connection's first (net/http shouldRetryRequest; kubernetes
// #127335 for POSTs). Here a connection's first request gets the idle
// timeout like every other, so the client closes it first. HTTP/2
// (Options.EnableHTTP2) needs net/http to see the *tls.Conn and does not
// use this listener.
type firstRequestListener struct {
	inner     net.Listener // a tls.NewListener: handshakes not yet done
	handshake time.Duration
	idle      time.Duration
	ready     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	err       error // why inner's Accept stopped
	pending   map[net.Conn]struct{}
}

func newFirstRequestListener(inner net.Listener, handshake, idle time.Duration) *firstRequestListener {
	l := &firstRequestListener{inner: inner, handshake: handshake, idle: idle,
		ready: make(chan net.Conn), done: make(chan struct{}), pending: map[net.Conn]struct{}{}}
	go l.acceptLoop()
	return l
}

func (l *firstRequestListener) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := l.inner.Accept()
		if err != nil {
			// As http.Server.Serve does: back off on a temporary error
			// (too many open files), stop on any other.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-l.done:
					return
				}
			}
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			l.close()
			return
		}
		backoff = 0
		l.mu.Lock()
		l.pending[c] = struct{}{}
		l.mu.Unlock()
		go l.prepare(c)
	}
}

// prepare hands c to Accept once its handshake is done and its first
// byte has arrived; it closes c if either does not come in time or the
// listener closes first.
func (l *firstRequestListener) prepare(c net.Conn) {
	delivered := false
	defer func() {
		l.mu.Lock()
		delete(l.pending, c)
		l.mu.Unlock()
		if !delivered {
			_ = c.Close()
		}
	}()
	if tc, ok := c.(*tls.Conn); ok {
		_ = c.SetDeadline(time.Now().Add(l.handshake))
		ctx, cancel := context.WithTimeout(context.Background(), l.handshake)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			// As net/http logs them (a caBundle that does not match the
			// serving certificate shows here); a peer gone before the
			// handshake (a TCP probe) is not worth a line.
			if !errors.Is(err, io.EOF) {
				log.Info("TLS handshake failed", "remote", c.RemoteAddr().String(), "error", err.Error())
			}
			return
		}
	}
	_ = c.SetDeadline(time.Now().Add(l.idle))
	br := bufio.NewReader(c)
	if _, err := br.Peek(1); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	select {
	case l.ready <- &bufferedConn{Conn: c, r: br}:
		delivered = true
	case <-l.done:
	}
}

// pendingConns counts the connections accepted and not yet handed over.
func (l *firstRequestListener) pendingConns() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(len(l.pending))
}

// Accept returns the next connection whose first request has begun.
func (l *firstRequestListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the connections not yet handed over
// (as http.Server.Shutdown closes connections that never sent a request).
func (l *firstRequestListener) Close() error {
	err := l.inner.Close()
	l.close()
	return err
}

func (l *firstRequestListener) close() {
	l.closeOnce.Do(func() {
		close(l.done)
		l.mu.Lock()
		defer l.mu.Unlock()
		for c := range l.pending {
			_ = c.Close()
		}
	})
}

func (l *firstRequestListener) Addr() net.Addr { return l.inner.Addr() }

// bufferedConn reads through the reader that peeked its first byte.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite lets net/http half-close before its lingering close, as it
// does on a *tls.Conn (a TLS close_notify).
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
