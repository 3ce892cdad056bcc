// Package servingtest starts a listener.Server on 127.0.0.1 with a fresh
// serving certificate, for tests of the HTTP envelope (webhooks/serving)
// and the listener under real TLS connections.
//
// It is for tests only: no non-test package may import it.
package servingtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/webhooks/listener"
)

// Server is a started listener.Server.
type Server struct {
	*listener.Server
	// Addr is host:port on 127.0.0.1.
	Addr string
	// ClientTLS trusts the server's CA and names "localhost".
	ClientTLS *tls.Config

	stop     context.CancelFunc
	stopOnce sync.Once
	errc     chan error
	err      error
}

// Stop ends the server's context (as SIGTERM does) and returns what Start
// returned once it did: the drain, then the shutdown (listener.Options).
// Later calls return the same.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.stop()
		s.err = <-s.errc
	})
	return s.err
}

// Start writes a CA-signed certificate for "localhost" into a temporary
// directory, starts a server with o (Host, Port and CertDir are set here)
// and the handlers register adds, and waits until it accepts connections.
// The server stops when the test ends.
func Start(tb testing.TB, o listener.Options, register func(*listener.Server)) *Server {
	tb.Helper()
	// The server and certwatcher log through controller-runtime's root.
	ctrllog.SetLogger(logr.Discard())
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	leaf, err := pki.NewServingCert(ca, pki.ServingOptions{DNSNames: []string{"localhost"}})
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), leaf.CertPEM, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), leaf.KeyPEM, 0o600); err != nil {
		tb.Fatal(err)
	}
	o.Host, o.Port, o.CertDir, o.CertName, o.KeyName = "127.0.0.1", 0, dir, "tls.crt", "tls.key"
	if o.MinTLSVersion == "" {
		o.MinTLSVersion = "1.3"
	}
	srv, err := o.NewServer()
	if err != nil {
		tb.Fatal(err)
	}
	if register != nil {
		register(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Start(ctx) }()
	s := &Server{Server: srv, stop: cancel, errc: errc}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("server: %v", err)
		}
	})
	check := srv.StartedChecker()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err := check(&http.Request{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			tb.Fatalf("server did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	s.Addr, s.ClientTLS = srv.Addr(), &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	return s
}

// Client is an HTTP/1.1 client for s with up to 64 keep-alive
// connections; further requests queue for one (counted in their latency)
// rather than open ever more connections when the server slows down.
func (s *Server) Client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig:     s.ClientTLS.Clone(),
		MaxIdleConnsPerHost: 64,
		MaxConnsPerHost:     64,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// URL is https://<Addr><path>.
func (s *Server) URL(path string) string { return "https://" + s.Addr + path }
