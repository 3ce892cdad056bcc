// Package serving holds what every hookwright webhook server shares: TLS
// settings, the certificate directory (reloaded by controller-runtime's
// certwatcher when the kubelet swaps a mounted Secret) and flag wiring.
package serving

import (
	"crypto/tls"
	"fmt"

	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Options configures a webhook server's listener and TLS.
type Options struct {
	// Host and Port the HTTPS listener binds; Port defaults to 9443.
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
}

// TLSVersion maps "1.2"/"1.3" to the crypto/tls constant.
func TLSVersion(s string) (uint16, error) {
	switch s {
	case "1.2", "VersionTLS12":
		return tls.VersionTLS12, nil
	case "", "1.3", "VersionTLS13":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("unsupported TLS version %q: want 1.2 or 1.3", s)
}

// TLSOpts returns the tls.Config mutators for these options.
func (o *Options) TLSOpts() ([]func(*tls.Config), error) {
	v, err := TLSVersion(o.MinTLSVersion)
	if err != nil {
		return nil, err
	}
	opts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = v }}
	if !o.EnableHTTP2 {
		opts = append(opts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	return opts, nil
}

// NewServer builds a controller-runtime webhook server from the options. The
// server's certwatcher reloads the certificate when the files change.
func (o *Options) NewServer() (webhook.Server, error) {
	tlsOpts, err := o.TLSOpts()
	if err != nil {
		return nil, err
	}
	return webhook.NewServer(webhook.Options{
		Host:     o.Host,
		Port:     o.Port,
		CertDir:  o.CertDir,
		CertName: o.CertName,
		KeyName:  o.KeyName,
		TLSOpts:  tlsOpts,
	}), nil
}
