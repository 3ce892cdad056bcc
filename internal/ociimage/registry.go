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
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"time"

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
// second free port of Addr's IP, with a self-signed certificate for that
// IP valid for a day, and sets TLSAddr and CAPEM. It is for clients that
// only speak HTTPS to a registry: operator-sdk v1.42.2 reads an index
// image's labels with operator-registry's containerd resolver without its
// plain-HTTP option (internal/registry GetImageLabels), so a plain-HTTP
// index image fails there. Images pushed to Addr are pulled from TLSAddr
// under the same repository (host:port is not part of it).
func (r *Registry) StartTLS() error {
	if r.tls != nil {
		return fmt.Errorf("ociimage: registry %s already serves TLS on %s", r.Addr, r.TLSAddr)
	}
	host, _, err := net.SplitHostPort(r.Addr)
	if err != nil {
		return err
	}
	cert, caPEM, err := selfSigned(net.ParseIP(host), time.Now())
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
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	}
	r.tlsDone = make(chan error, 1)
	go func() { r.tlsDone <- r.tls.ServeTLS(ln, "", "") }()
	return nil
}

// selfSigned returns an ECDSA P-256 certificate for ip, valid from a
// minute before now for a day, as a tls.Certificate and as PEM.
func selfSigned(ip net.IP, now time.Time) (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "hookwright local registry " + ip.String()},
		IPAddresses:           []net.IP{ip},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
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

// Push pushes imgs to the registry at addr (see Push).
func (r *Registry) Push(ctx context.Context, imgs ...Named) error {
	return Push(ctx, r.Addr, imgs...)
}

// Push uploads each image to the registry at addr (a loopback host:port,
// plain HTTP) under LocalReference(addr, its name).
func Push(ctx context.Context, addr string, imgs ...Named) error {
	if err := checkLoopback(addr); err != nil {
		return err
	}
	// No proxy from the environment: the registry is on this machine.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	for _, n := range imgs {
		ref, err := LocalReference(addr, n.Name)
		if err != nil {
			return err
		}
		if err := remote.Write(ref, n.Image, remote.WithContext(ctx), remote.WithTransport(tr)); err != nil {
			return fmt.Errorf("ociimage: push %s to %s: %w", n.Name, ref, err)
		}
	}
	return nil
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

// LocalReference is where the image named ref lives in the local registry
// at addr: the repository is the normalized name with its registry host as
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
