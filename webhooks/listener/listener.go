// Package listener is the HTTPS listener every hookwright webhook server
// runs (the injector, the oversell server and the manager's validating
// webhook): TLS settings, the certificate directory (reloaded by
// controller-runtime's certwatcher when the kubelet swaps a mounted
// Secret), flag wiring, timeouts on every phase of a request and a
// connection limit, as a controller-runtime webhook.Server (Server). The
// handlers it serves read their bodies through webhooks/serving's
// Envelope, which Options.Envelope sizes from the same flags.
//
// Files: listener.go options and flags, server.go the listener and TLS.
//
// It may import webhooks/serving and controller-runtime, nothing else of
// ours: both servers' command wiring and the manager build on it. The
// engines never import it (they would pull in controller-runtime's
// manager and clients).
package listener

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/hookwright/hookwright/webhooks/serving"
)

var log = ctrl.Log.WithName("webhook-server")

// Options configures a webhook server's listener and TLS.
type Options struct {
	// Host and Port the HTTPS listener binds; the --webhook-port flag
	// defaults to 9443, and Port 0 binds a free port (Server.Addr reports it).
	Host string
	Port int
	// CertDir holds CertName and KeyName (tls.crt, tls.key), watched for changes.
	CertDir  string
	CertName string
	KeyName  string
	// MinTLSVersion is "1.2" or "1.3" (default).
	MinTLSVersion string
	// EnableHTTP2 is off by default (CVE-2023-44487, rapid reset).
	EnableHTTP2 bool
	// RequestTimeout bounds reading a request's headers and body and
	// writing its response; 0 means serving.DefaultTimeout
	// (30 s, the largest webhook timeoutSeconds). A request carrying the
	// API server's timeout parameter gets the smaller of the two for its
	// body (Envelope.Deadline).
	RequestTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long; 0 means
	// defaultIdleTimeout. Keep it above the callers' own idle timeout.
	IdleTimeout time.Duration
	// MaxInflightBytes bounds the body bytes held by all requests being
	// served; 0 means serving.DefaultMaxInflight (32 MiB).
	MaxInflightBytes int64
	// MaxConnections bounds open connections (golang.org/x/net/netutil);
	// further clients wait in the kernel's accept queue. 0 means no limit.
	MaxConnections int
	// DrainPeriod is how long the server keeps serving after its context
	// ends (SIGTERM) before it stops accepting: readiness fails at once
	// (StartedChecker) and every answer carries "Connection: close", so
	// the API server's pooled keep-alive connections move to another
	// replica at their next call instead of meeting a closed socket (the
	// API server does not retry a POST that got EOF, kubernetes #127335).
	// 0 (or negative) means none; the --drain-period flag defaults to
	// DefaultDrainPeriod.
	DrainPeriod time.Duration
	// DrainDone, when non-nil, ends the drain period early once closed
	// (tests step through the shutdown with it).
	DrainDone <-chan struct{}
	// CloseWait is how long, after the drain period, the server keeps
	// serving while clients still hold connections to it; it stops as
	// soon as none is open, and closes what remains when CloseWait ends.
	// Only a client can close an idle keep-alive connection without a
	// race: a server closing one meets, now and then, a request the
	// client sent on it in that instant, and the API server does not
	// retry a POST that got EOF. The API server closes a pooled
	// connection after 90 s idle, so with DefaultCloseWait the server
	// never closes one itself. 0 (or negative) means no wait; the
	// --drain-close-wait flag defaults to DefaultCloseWait.
	CloseWait time.Duration
	// Unreachable, when set, reports that no client can call the server
	// any more (its CR, and with it the webhook configuration, is being
	// deleted): the close wait then ends at once. Read during the close
	// wait only.
	Unreachable func() bool
}

// DefaultCloseWait is the idle timeout of the API server's webhook client
// (http.DefaultTransport's IdleConnTimeout, which client-go's transport
// inherits through apimachinery's SetTransportDefaults). Every answer
// during the drain closes its connection, so a connection still open when
// the drain period ends was last used before it began, and the client
// closes it within DefaultCloseWait.
const DefaultCloseWait = 90 * time.Second

// DefaultDrainPeriod covers the removal of a terminating pod's endpoint
// reaching every path the API server dials through: the EndpointSlice
// controller marks the endpoint terminating at once, then kube-proxy
// rewrites its rules no sooner than its --iptables-min-sync-period (1 s)
// and the API server's own endpoint informer follows within about a
// second; a few seconds more let busy pooled connections make one more
// call and move. openchoreo #3743 went from 181 failed calls to 0 with a
// few seconds' preStop delay. After it, in-flight reviews get up to the
// request timeout (the webhook's timeoutSeconds bounds them anyway).
const DefaultDrainPeriod = 5 * time.Second

func (o *Options) drainPeriod() time.Duration { return max(o.DrainPeriod, 0) }

func (o *Options) closeWait() time.Duration { return max(o.CloseWait, 0) }

// ShutdownBound is the longest Server.Start takes to return after its
// context ends: the drain period, the wait for clients to close their
// connections, then in-flight reviews up to the request timeout and the
// second a late answer gets to go out. A manager's GracefulShutdownTimeout
// and a pod's terminationGracePeriodSeconds must be above it.
func (o *Options) ShutdownBound() time.Duration {
	return o.drainPeriod() + o.closeWait() + o.timeout() + time.Second
}

// defaultIdleTimeout is above the 90 s idle timeout of the API server's
// webhook client (client-go's transport takes http.DefaultTransport's
// IdleConnTimeout through apimachinery's SetTransportDefaults), so the
// client always closes an idle connection first. A server closing first
// races the client reusing it, and the API server does not retry a POST
// that got EOF: the admission call fails. An idle connection costs about
// 45 KiB and no body budget, and --max-connections bounds how many there are.
const defaultIdleTimeout = 120 * time.Second

func (o *Options) idleTimeout() time.Duration {
	if o.IdleTimeout > 0 {
		return o.IdleTimeout
	}
	return defaultIdleTimeout
}

func (o *Options) timeout() time.Duration {
	if o.RequestTimeout > 0 {
		return o.RequestTimeout
	}
	return serving.DefaultTimeout
}

// AddFlags registers the options on fs with their defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Host, "webhook-host", "", "address the webhook HTTPS listener binds (empty: all)")
	fs.IntVar(&o.Port, "webhook-port", 9443, "port of the webhook HTTPS listener")
	fs.StringVar(&o.CertDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with the serving certificate and key, reloaded on change")
	fs.StringVar(&o.CertName, "cert-name", "tls.crt", "serving certificate file name in --cert-dir")
	fs.StringVar(&o.KeyName, "key-name", "tls.key", "serving key file name in --cert-dir")
	fs.StringVar(&o.MinTLSVersion, "tls-min-version", "1.3", "minimum TLS version: 1.2 or 1.3")
	fs.BoolVar(&o.EnableHTTP2, "enable-http2", false, "serve HTTP/2 (off by default: CVE-2023-44487)")
	fs.DurationVar(&o.RequestTimeout, "request-timeout", serving.DefaultTimeout, "bound on reading a request and writing its answer (at most the 30s webhook timeout is useful)")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", defaultIdleTimeout, "close keep-alive connections idle this long (keep it above the API server's 90s)")
	fs.Int64Var(&o.MaxInflightBytes, "max-inflight-bytes", serving.DefaultMaxInflight, "bound on the request body bytes held by all requests in flight; excess waits 1s, then gets 429")
	fs.IntVar(&o.MaxConnections, "max-connections", 1000, "bound on open client connections (0: no limit)")
	fs.DurationVar(&o.DrainPeriod, "drain-period", DefaultDrainPeriod, "after SIGTERM, keep serving this long with readiness failing and every answer closing its connection, then wait for clients to close their connections, stop accepting and finish in-flight reviews (0: none)")
	fs.DurationVar(&o.CloseWait, "drain-close-wait", DefaultCloseWait, "after the drain period, keep serving up to this long until clients have closed every connection (the API server closes idle ones after 90s), then close the rest (0: no wait)")
}

// tlsVersion maps "1.2"/"1.3" to the crypto/tls constant.
func tlsVersion(s string) (uint16, error) {
	switch s {
	case "1.2", "VersionTLS12":
		return tls.VersionTLS12, nil
	case "", "1.3", "VersionTLS13":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("unsupported TLS version %q: want 1.2 or 1.3", s)
}

// tlsOpts returns the tls.Config mutators for these options.
func (o *Options) tlsOpts() ([]func(*tls.Config), error) {
	v, err := tlsVersion(o.MinTLSVersion)
	if err != nil {
		return nil, err
	}
	opts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = v }}
	if !o.EnableHTTP2 {
		opts = append(opts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	return opts, nil
}

// NewServer builds the webhook server from the options (see Server). The
// server's certwatcher reloads the certificate when the files change.
func (o *Options) NewServer() (*Server, error) { return o.NewServerWithTLS() }

// NewServerWithTLS is NewServer with extra tls.Config mutators applied after
// the options' own; one that sets GetCertificate replaces the certwatcher
// on CertDir (the manager serves certificates it issues itself).
func (o *Options) NewServerWithTLS(extra ...func(*tls.Config)) (*Server, error) {
	tlsOpts, err := o.tlsOpts()
	if err != nil {
		return nil, err
	}
	return &Server{o: *o, tlsOpts: append(tlsOpts, extra...), mux: http.NewServeMux()}, nil
}

// Envelope returns the body envelope for handlers of a server built from
// these options: 3 MiB bodies, the in-flight budget and the request timeout.
func (o *Options) Envelope() *serving.Envelope {
	return serving.NewEnvelope(serving.EnvelopeOptions{MaxInflight: o.MaxInflightBytes, Timeout: o.timeout()})
}
