package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hookwright/hookwright/test/cluster"
)

// webhookServer is a hookwright webhook server (injector or oversell) run as
// a local process, with a serving certificate for its Service's DNS names.
type webhookServer struct {
	name      string
	args      []string
	certDir   string
	logDir    string
	ca        *cluster.TestCA
	port      int
	probePort int
	proc      *cluster.Process
}

// Addr is the local address of the HTTPS listener.
func (s *webhookServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// atExit runs in TestMain after the tests: cleanups of shared servers.
var atExit []func()

// startWebhookServer starts a server; shared ones outlive the calling test
// and are stopped after all tests.
func startWebhookServer(t *testing.T, shared bool, subcommand, namespace, service string, extra ...string) *webhookServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "hw-srv-")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cluster.NewTestCA(service + "-ca")
	if err != nil {
		t.Fatal(err)
	}
	s := &webhookServer{name: service, ca: ca, certDir: filepath.Join(dir, "certs"), logDir: dir, port: cluster.MustFreePort(t), probePort: cluster.MustFreePort(t)}
	if err := ca.WriteServing(s.certDir, cluster.ServiceDNSNames(namespace, service)...); err != nil {
		t.Fatal(err)
	}
	s.args = append([]string{subcommand,
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", s.port),
		"--cert-dir=" + s.certDir,
		"--metrics-bind-address=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", s.probePort),
	}, extra...)
	s.start(t)
	stop := func() { _ = s.proc.Stop(5 * time.Second); _ = os.RemoveAll(dir) }
	if shared {
		atExit = append(atExit, stop)
	} else {
		t.Cleanup(stop)
	}
	return s
}

func (s *webhookServer) start(t *testing.T) {
	t.Helper()
	bin := cluster.MustHookwrightBinary(t)
	p, err := cluster.StartProcess(s.name, s.logDir, bin, s.args, []string{"KUBECONFIG=" + env.Kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	s.proc = p
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = cluster.WaitFor(ctx, 60*time.Second, s.name+" /readyz", func(ctx context.Context) (bool, error) {
		if done, perr := p.Exited(); done {
			return false, cluster.Permanent(fmt.Errorf("exited: %v\n%s", perr, p.Tail(3000)))
		}
		res, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", s.probePort))
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("%v\nlog:\n%s", err, p.Tail(3000))
	}
}

// stop ends the process (the Service route stays: calls then fail to connect).
func (s *webhookServer) stop() { _ = s.proc.Stop(5 * time.Second) }

// configz GETs /configz from the server over verified TLS.
func (s *webhookServer) configz(into any) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.ca.CertPEM)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: s.name + ".svc", MinVersion: tls.VersionTLS12,
		// The certificate names <svc>.<ns>.svc; verify against the CA only.
		InsecureSkipVerify: true, //nolint:gosec // verified below with VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			cert, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			_, err = cert.Verify(x509.VerifyOptions{Roots: pool})
			return err
		},
	}}}
	res, err := c.Get("https://" + s.Addr() + "/configz")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("/configz: %s: %s", res.Status, b)
	}
	return json.Unmarshal(b, into)
}
