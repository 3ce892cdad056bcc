package ociimage

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is go-containerregistry's OCI distribution registry (blobs and
// manifests in memory) serving plain HTTP on a loopback address.
type Registry struct {
	// Addr is host:port, e.g. 127.0.0.1:40123.
	Addr string
	// TLSAddr is the HTTPS listener of StartTLS, empty before it.
	TLSAddr string
	// CAPEM is the certificate TLSAddr serves (self-signed, PEM), for a
	// client's trust store (SSL_CERT_FILE); nil before StartTLS.
	CAPEM   []byte
	srv     *http.Server
	done    chan error
	tls     *http.Server
	tlsDone chan error
}

// StartRegistry serves a new, empty registry on addr ("127.0.0.1:0" picks
// a free port when addr is empty). Only loopback addresses are accepted:
// the registry is for this machine. logw receives its request log (nil
// discards it). Close stops it.
func StartRegistry(addr string, logw io.Writer) (*Registry, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if err := checkLoopback(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ociimage: registry: %w", err)
	}
	if logw == nil {
		logw = io.Discard
	}
	r := &Registry{
		Addr: ln.Addr().String(),
		srv: &http.Server{
			Handler:           registry.New(registry.Logger(log.New(logw, "registry: ", log.LstdFlags))),
			ReadHeaderTimeout: 30 * time.Second,
		},
		done: make(chan error, 1),
	}
	go func() { r.done <- r.srv.Serve(ln) }()
	return r, nil
}

// StartTLS serves the same registry (the same images) over HTTPS on a
// second free port of Addr's IP and sets TLSAddr and CAPEM: a CA made for
// this registry alone signs the listener's certificate (for that IP), both
// valid for tlsValidity from a minute ago. It is for clients that only
// speak HTTPS to a registry: operator-sdk v1.42.2 reads an index image's
// labels with operator-registry's containerd resolver without its
// plain-HTTP option (internal/registry GetImageLabels), so a plain-HTTP
// index image fails there. Images pushed to Addr are pulled from TLSAddr
// under the same repository (host:port is not part of it); WriteTLSFiles
// writes the CA for clients and containerdTLSHosts for containerd.
func (r *Registry) StartTLS() error {
	if r.tls != nil {
		return fmt.Errorf("ociimage: registry %s already serves TLS on %s", r.Addr, r.TLSAddr)
	}
	host, _, err := net.SplitHostPort(r.Addr)
	if err != nil {
		return err
	}
	cert, caPEM, err := registryCertificate(net.ParseIP(host), time.Now())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fmt.Errorf("ociimage: registry TLS: %w", err)
	}
	r.TLSAddr, r.CAPEM = ln.Addr().String(), caPEM
	r.tls = &http.Server{
		Handler:           r.srv.Handler,
		ReadHeaderTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
		},
		// HTTP/1.1 only. go-containerregistry's registry reads an upload's
		// body while holding one lock for all blobs (pkg/registry/blobs.go).
		// Over HTTP/2 a client's parallel uploads share one connection's
		// flow-control window: the streams waiting for the lock fill it,
		// and the stream holding the lock never gets its next bytes (a
		// make bundle-image hung so for 14 minutes). A non-nil empty map
		// turns net/http's automatic HTTP/2 off.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	r.tlsDone = make(chan error, 1)
	go func() { r.tlsDone <- r.tls.ServeTLS(ln, "", "") }()
	return nil
}

// tlsValidity is how long a registry's CA and certificate are valid: the
// registry keeps its images in memory, so it never outlives its process,
// and a demo left running for weeks still serves.
const tlsValidity = 30 * 24 * time.Hour

// registryCertificate returns a serving certificate for ip (ECDSA P-256,
// server auth) and the PEM of the CA that signed it, a CA of its own
// (ECDSA P-256, cert sign only), both valid from a minute before now for
// tlsValidity.
func registryCertificate(ip net.IP, now time.Time) (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{CommonName: "hookwright local registry CA " + ip.String()},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(tlsValidity),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(),
		Subject:      pkix.Name{CommonName: "hookwright local registry " + ip.String()},
		IPAddresses:  []net.IP{ip},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(tlsValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

func serialNumber() *big.Int {
	// crypto/rand.Int never fails on Linux (getrandom).
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// TLSFiles are the files WriteTLSFiles writes.
type TLSFiles struct {
	// CA is the registry's CA certificate (PEM): containerd's `ca` for
	// TLSAddr (containerdTLSHosts).
	CA string
	// Trust is the system's CA bundle followed by the registry's CA, for
	// SSL_CERT_FILE: a shell that sets it still reaches every other HTTPS
	// server it did.
	Trust string
}

// WriteTLSFiles writes the registry's CA to dir/ca.crt and the trust store
// dir/trust.pem (systemBundle's certificates, if the file exists, then the
// CA). StartTLS must have run.
func (r *Registry) WriteTLSFiles(dir, systemBundle string) (TLSFiles, error) {
	if r.CAPEM == nil {
		return TLSFiles{}, fmt.Errorf("ociimage: registry %s serves no TLS", r.Addr)
	}
	f := TLSFiles{CA: filepath.Join(dir, "ca.crt"), Trust: filepath.Join(dir, "trust.pem")}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return f, err
	}
	system, err := os.ReadFile(systemBundle)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return f, err
	}
	if len(system) > 0 && system[len(system)-1] != '\n' {
		system = append(system, '\n')
	}
	if err := os.WriteFile(f.CA, r.CAPEM, 0o644); err != nil {
		return f, err
	}
	return f, os.WriteFile(f.Trust, append(system, r.CAPEM...), 0o644)
}

// Close stops the registry (both listeners) and waits for its servers to
// end; its images are gone.
func (r *Registry) Close() error {
	var errs []error
	if r.tls != nil {
		errs = append(errs, r.tls.Close())
		if serr := <-r.tlsDone; !errors.Is(serr, http.ErrServerClosed) {
			errs = append(errs, serr)
		}
	}
	errs = append(errs, r.srv.Close())
	if serr := <-r.done; !errors.Is(serr, http.ErrServerClosed) {
		errs = append(errs, serr)
	}
	return errors.Join(errs...)
}

// Push pushes imgs to the registry's plain listener (see Push).
func (r *Registry) Push(ctx context.Context, imgs ...Named) error {
	return Push(ctx, r.Addr, imgs...)
}

// Push uploads each image to the registry at addr (a loopback host:port,
// plain HTTP) under LocalReference(addr, its name).
func Push(ctx context.Context, addr string, imgs ...Named) error {
	if err := checkLoopback(addr); err != nil {
		return err
	}
	return PushTo(ctx, addr, false, imgs...)
}

// PushTo uploads each image to the registry at registry (host[:port]) under
// LocalReference(registry, its name), over HTTPS with the registry's
// certificate verified against the system's roots (SSL_CERT_FILE too) and
// credentials from the Docker config (authn.DefaultKeychain), unless
// insecure: then the certificate is not verified and plain HTTP is allowed.
// A loopback registry may always be plain HTTP (it never leaves the
// machine) and is reached without a proxy.
func PushTo(ctx context.Context, registry string, insecure bool, imgs ...Named) error {
	opts, err := RemoteOptions(ctx, registry, insecure)
	if err != nil {
		return err
	}
	for _, n := range imgs {
		ref, err := LocalReference(registry, n.Name)
		if err != nil {
			return err
		}
		if err := remote.Write(ref, n.Image, opts...); err != nil {
			return fmt.Errorf("ociimage: push %s to %s: %w", n.Name, ref, err)
		}
	}
	return nil
}

// RemoteOptions are go-containerregistry's options for the registry at
// registry as PushTo reaches it.
func RemoteOptions(ctx context.Context, registry string, insecure bool) ([]remote.Option, error) {
	loopback := checkLoopback(registry) == nil
	if !loopback {
		if _, err := name.NewRegistry(registry); err != nil || strings.ContainsAny(registry, "/@") {
			return nil, fmt.Errorf("ociimage: registry %q: want host[:port]", registry)
		}
	}
	roots, err := RootsFromEnvFile(os.Getenv("SSL_CERT_FILE"))
	if err != nil {
		return nil, err
	}
	tr := transportFor(registry, roots, insecure)
	rt := http.RoundTripper(tr)
	if !loopback && !insecure {
		rt = httpsOnly{tr}
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(rt)}
	if !loopback {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	return opts, nil
}

// RootsFromEnvFile reads the PEM trust store p (SSL_CERT_FILE's value)
// into a pool, or returns nil (the system's roots) when p is empty. Go
// reads SSL_CERT_FILE too, but once per process: reading it here makes
// each call see the file as it is.
func RootsFromEnvFile(p string) (*x509.CertPool, error) {
	if p == "" {
		return nil, nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("ociimage: SSL_CERT_FILE: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("ociimage: SSL_CERT_FILE %s holds no PEM certificate", p)
	}
	return pool, nil
}

// transportFor is the HTTP transport to registry: no proxy for a loopback
// address, roots (nil: the system's) to verify its certificate, or no
// verification when insecure.
func transportFor(registry string, roots *x509.CertPool, insecure bool) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if checkLoopback(registry) == nil {
		tr.Proxy = nil
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if insecure {
		tr.TLSClientConfig.InsecureSkipVerify = true
	}
	return tr
}

// HTTPSTransport is a transport that reaches registry over HTTPS only, as
// operator-sdk does (its certificate verified against roots, nil for the
// system's, unless insecure), for checks of what operator-sdk will read.
func HTTPSTransport(registry string, roots *x509.CertPool, insecure bool) http.RoundTripper {
	return httpsOnly{transportFor(registry, roots, insecure)}
}

// ErrPlainHTTP is why httpsOnly refused a request.
var ErrPlainHTTP = errors.New("plain HTTP is refused here (for a registry off this machine, IMAGE_REGISTRY_INSECURE=true allows it)")

// httpsOnly refuses plain-HTTP requests: go-containerregistry falls back to
// HTTP for private (RFC 1918) addresses when HTTPS fails, which would skip
// the verification the caller asked for.
type httpsOnly struct{ rt http.RoundTripper }

func (h httpsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" {
		return nil, fmt.Errorf("ociimage: %s: refusing plain HTTP: %w", req.URL.Host, ErrPlainHTTP)
	}
	return h.rt.RoundTrip(req)
}

// normalize returns ref in containerd's normalized form: registry, full
// repository and tag or digest (nginx:1.23-alpine ->
// docker.io/library/nginx:1.23-alpine; a missing tag is latest).
func normalize(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("ociimage: image name %q: %w", ref, err)
	}
	host := r.Context().RegistryStr()
	if host == name.DefaultRegistry {
		host = "docker.io" // go-containerregistry says index.docker.io
	}
	sep := ":"
	if _, ok := r.(name.Digest); ok {
		sep = "@"
	}
	return host + "/" + r.Context().RepositoryStr() + sep + r.Identifier(), nil
}

// LocalReference is where the image named ref lives in the registry at
// addr (host[:port]; plain HTTP allowed only for a loopback address): the repository is the normalized name with its registry host as
// the first path element (ghcr.io/hookwright/proxy:1.4.2 ->
// <addr>/ghcr.io/hookwright/proxy:1.4.2), the path containerdHosts sends
// containerd to. A ref already on addr stays as it is.
func LocalReference(addr, ref string) (name.Reference, error) {
	n, err := normalize(ref)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(n, addr+"/") {
		n = addr + "/" + n
	}
	if checkLoopback(addr) != nil {
		return name.ParseReference(n)
	}
	return name.ParseReference(n, name.Insecure)
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("ociimage: registry address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("ociimage: registry address %q: want a loopback IP (127.0.0.0/8 or ::1), this registry never leaves the machine", addr)
	}
	return nil
}

// Serve builds the sets (see Build), starts a registry on a free
// 127.0.0.1 port and pushes them: what a test harness needs before a node
// pulls. Pair it with WriteContainerdHosts(dir, r.Addr, MirroredRegistries)
// for containerd. The caller closes the registry.
func Serve(ctx context.Context, o Options, sets ...string) (*Registry, []Named, error) {
	imgs, err := Build(ctx, o, sets...)
	if err != nil {
		return nil, nil, err
	}
	r, err := StartRegistry("", nil)
	if err != nil {
		return nil, nil, err
	}
	if err := r.Push(ctx, imgs...); err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, imgs, nil
}
