package listener

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Server is a webhook.Server whose http.Server has read, header and idle
// timeouts and a connection limit. controller-runtime's DefaultServer
// (v0.25) builds its http.Server internally with only a 32 s header timeout
// and no body timeout, and offers no option to change that, so this
// implementation replaces it; it keeps DefaultServer's behaviour otherwise:
// TLS from Options with certwatcher reloading the files, paths on one
// ServeMux, a StartedChecker that dials the listener, and a graceful
// shutdown when the manager stops, which this one precedes with a drain
// period (Options.DrainPeriod).
type Server struct {
	o       Options
	tlsOpts []func(*tls.Config)
	mux     *http.ServeMux

	// draining is set when the context ends: readiness fails and every
	// answer closes its connection.
	draining atomic.Bool
	// conns counts the connections net/http serves (ConnState).
	conns atomic.Int64

	mu      sync.Mutex
	started bool
	addr    string
}

var _ webhook.Server = (*Server)(nil)

// NeedLeaderElection is false: every replica serves.
func (s *Server) NeedLeaderElection() bool { return false }

// Register serves hook at path; a duplicate path panics (http.ServeMux).
func (s *Server) Register(path string, hook http.Handler) { s.mux.Handle(path, hook) }

// WebhookMux is the server's ServeMux.
func (s *Server) WebhookMux() *http.ServeMux { return s.mux }

// Addr is the bound listener address once started, else "".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// httpServer is the http.Server for handler: every phase of a request is
// bounded by the request timeout (the webhook timeout's upper bound), idle
// keep-alive connections are closed after the idle timeout (longer than the
// API server's, see defaultIdleTimeout), headers are capped at 64 KiB (an
// AdmissionReview call carries a handful), and HTTP/2 is off unless enabled
// (CVE-2023-44487).
func (o *Options) httpServer(ctx context.Context, handler http.Handler) *http.Server {
	t := o.timeout()
	srv := &http.Server{
		BaseContext:       func(net.Listener) context.Context { return ctx },
		Handler:           handler,
		ReadHeaderTimeout: t,
		ReadTimeout:       t,
		// The response follows the body within the same timeout; the
		// extra second lets a 408 for a body cut at ReadTimeout go out.
		WriteTimeout:   t + time.Second,
		IdleTimeout:    o.idleTimeout(),
		MaxHeaderBytes: 64 << 10,
	}
	if !o.EnableHTTP2 {
		// A non-nil empty map turns off net/http's automatic HTTP/2.
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	return srv
}

// Draining reports whether the server's context ended and it is draining
// or shutting down.
func (s *Server) Draining() bool { return s.draining.Load() }

// closeWhileDraining answers with "Connection: close" once the server
// drains: net/http then closes the connection after the answer, and the
// client, told so, dials anew (through the Service, to a ready replica)
// rather than reusing a connection that is about to go.
func (s *Server) closeWhileDraining(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// trackConn counts the connections net/http holds open.
func (s *Server) trackConn(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		s.conns.Add(1)
	case http.StateClosed, http.StateHijacked:
		s.conns.Add(-1)
	}
}

// waitForClients keeps serving until open reports no connection, the
// server is unreachable (Options.Unreachable), or wait passes; it returns
// how many connections were still open then.
func (s *Server) waitForClients(wait time.Duration, open func() int64) int64 {
	unreachable := func() bool { return s.o.Unreachable != nil && s.o.Unreachable() }
	n := open()
	if n == 0 || wait <= 0 {
		return n
	}
	if unreachable() {
		log.Info("not waiting for clients to close their connections: the webhook has no callers left", "open", n)
		return n
	}
	log.Info("waiting for clients to close their connections", "open", n, "atMost", wait.String())
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	// A poll, not a signal: ConnState and the first-request listener
	// both close connections, and a shutdown can spare 100 ms.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			return open()
		case <-tick.C:
			if n = open(); n == 0 || unreachable() {
				return n
			}
		}
	}
}

// Start serves until ctx is done, then drains for the drain period
// (readiness failing, connections closed after each answer), keeps
// serving until clients have closed their connections or the close wait
// passed, stops accepting, closes what is left idle and waits for
// in-flight reviews up to the request timeout; it returns within
// Options.ShutdownBound.
func (s *Server) Start(ctx context.Context) error {
	cfg := &tls.Config{NextProtos: []string{"h2", "http/1.1"}}
	for _, op := range s.tlsOpts {
		op(cfg)
	}
	if cfg.GetCertificate == nil {
		certName, keyName := s.o.CertName, s.o.KeyName
		if certName == "" {
			certName = "tls.crt"
		}
		if keyName == "" {
			keyName = "tls.key"
		}
		cw, err := certwatcher.New(filepath.Join(s.o.CertDir, certName), filepath.Join(s.o.CertDir, keyName))
		if err != nil {
			return err
		}
		cfg.GetCertificate = cw.GetCertificate
		go func() {
			if err := cw.Start(ctx); err != nil {
				log.Error(err, "certificate watcher error")
			}
		}()
	}
	// Port 0 binds a free port (tests); Addr reports it.
	ln, err := net.Listen("tcp", net.JoinHostPort(s.o.Host, strconv.Itoa(s.o.Port)))
	if err != nil {
		return err
	}
	if s.o.MaxConnections > 0 {
		ln = netutil.LimitListener(ln, s.o.MaxConnections)
	}
	ln = tls.NewListener(ln, cfg)
	open := s.conns.Load
	if !s.o.EnableHTTP2 {
		fr := newFirstRequestListener(ln, s.o.timeout(), s.o.idleTimeout())
		// A connection that has not carried a request yet may sit in the
		// client's pool all the same (net/http pools a connection dialed
		// for a request another one served).
		open = func() int64 { return s.conns.Load() + fr.pendingConns() }
		ln = fr
	}
	// Requests keep their own context through the drain: the base context
	// is not ctx, which ends when the drain begins.
	srv := s.o.httpServer(context.WithoutCancel(ctx), s.closeWhileDraining(s.mux))
	srv.ConnState = s.trackConn
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		s.draining.Store(true)
		d := s.o.drainPeriod()
		log.Info("draining the webhook server", "period", d.String())
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.o.DrainDone:
		}
		t.Stop()
		if left := s.waitForClients(s.o.closeWait(), open); left > 0 {
			log.Info("closing connections clients still hold", "open", left)
		}
		sctx, cancel := context.WithTimeout(context.Background(), s.o.timeout()+time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Error(err, "shutting down the webhook server")
		}
	}()
	s.mu.Lock()
	s.started, s.addr = true, ln.Addr().String()
	s.mu.Unlock()
	log.Info("serving webhook server", "address", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-done
	return nil
}

// StartedChecker passes once the listener accepts TLS connections and
// fails again from the moment the server drains: it is a readiness check
// (never use it for liveness, or the kubelet restarts a draining server).
func (s *Server) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		if s.draining.Load() {
			return errors.New("webhook server is draining for shutdown")
		}
		addr := s.Addr()
		if addr == "" {
			return errors.New("webhook server has not been started yet")
		}
		d := &net.Dialer{Timeout: 10 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a liveness dial, nothing is sent
		if err != nil {
			return fmt.Errorf("webhook server is not reachable: %w", err)
		}
		return conn.Close()
	}
}
