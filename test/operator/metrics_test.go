package operator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/test/cluster"
)

// `hookwright manager --metrics-bind-address=...` serves HTTPS by default and
// lets the API server decide every scrape (TokenReview, SubjectAccessReview
// on the non-resource URL /metrics): no token is 401, a ServiceAccount
// without config/rbac's metrics-reader role is 403, one bound to it gets the
// metrics. The manager runs as a ServiceAccount holding only config/rbac's
// metrics-auth-role, so that role is shown to be enough for the reviews (and
// its controllers can read nothing, so they never act on other tests' CRs).
// With --metrics-cert-path it serves that certificate; with
// --metrics-secure=false plain HTTP to anyone (local runs).
func TestManagerSecureMetrics(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	ns := "metrics-test"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	// config/rbac's roles, renamed so they cannot meet another install's.
	authRole := loadClusterRole(t, "metrics_auth_role.yaml", "metrics-test-auth")
	readerRole := loadClusterRole(t, "metrics_reader_role.yaml", "metrics-test-reader")
	for _, sa := range []string{"manager", "scraper", "stranger"} {
		if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	bind(t, ctx, authRole, ns, "manager")
	bind(t, ctx, readerRole, ns, "scraper")
	kubeconfig := serviceAccountKubeconfig(t, t.TempDir(), ns, "manager")

	caDir := filepath.Join(t.TempDir(), "metrics-certs")
	ca, err := cluster.NewTestCA("metrics-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteServing(caDir, "localhost"); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	for _, tc := range []struct {
		name  string
		args  []string
		https *tls.Config // nil: plain HTTP
	}{
		{"self-signed", nil, &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // the generated certificate has no CA to verify
		{"cert-path", []string{"--metrics-cert-path=" + caDir}, &tls.Config{RootCAs: roots, ServerName: "localhost"}},
		{"insecure", []string{"--metrics-secure=false"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := startMetricsManager(t, kubeconfig, tc.args)
			hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc.https}}
			url := fmt.Sprintf("https://127.0.0.1:%d/metrics", port)
			if tc.https == nil {
				url = fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
				if code, body := scrape(t, hc, url, ""); code != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
					t.Fatalf("plain HTTP scrape without a token: %d\n%.500s", code, body)
				}
				return
			}
			if code, body := scrape(t, hc, url, ""); code != http.StatusUnauthorized {
				t.Errorf("no token: %d, want 401\n%.500s", code, body)
			}
			// A token the API server rejects is refused too, but
			// controller-runtime v0.25.2's filter answers 500: the webhook
			// token authenticator returns the TokenReview's status.error as an
			// error, which the filter maps to 500 rather than 401.
			if code, body := scrape(t, hc, url, "not-a-token"); code != http.StatusUnauthorized && code != http.StatusInternalServerError {
				t.Errorf("bogus token: %d, want 401 or 500\n%.500s", code, body)
			} else {
				t.Logf("bogus token refused with %d", code)
			}
			if code, body := scrape(t, hc, url, token(t, ctx, ns, "stranger")); code != http.StatusForbidden {
				t.Errorf("ServiceAccount without metrics-reader: %d, want 403\n%.500s", code, body)
			}
			start := time.Now()
			code, body := scrape(t, hc, url, token(t, ctx, ns, "scraper"))
			if code != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
				t.Fatalf("ServiceAccount bound to metrics-reader: %d, want 200 with controller-runtime metrics\n%.500s", code, body)
			}
			t.Logf("authorized scrape: %d bytes in %v", len(body), time.Since(start))
		})
	}
}

func loadClusterRole(t *testing.T, file, name string) *rbacv1.ClusterRole {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}
	r := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(data, r); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	r.Name = name
	if err := env.Client.Create(context.Background(), r); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), r) })
	return r
}

func bind(t *testing.T, ctx context.Context, role *rbacv1.ClusterRole, ns, sa string) {
	t.Helper()
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}
	if err := env.Client.Create(ctx, b); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), b) })
}

// token is a TokenRequest token of ServiceAccount ns/name, as a projected
// token volume gives a pod (Prometheus's).
func token(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	exp := int64(3600)
	tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func scrape(t *testing.T, hc *http.Client, url, bearer string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// startMetricsManager runs `hookwright manager` with its metrics on a free
// local port and returns the port once /readyz answers.
func startMetricsManager(t *testing.T, kubeconfig string, extra []string) int {
	t.Helper()
	port, probe := cluster.MustFreePort(t), cluster.MustFreePort(t)
	args := append([]string{
		"manager", "--namespace=" + operatorNS, "--leader-elect=false", "--server-image=" + serverImage,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", port),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
		fmt.Sprintf("--webhook-port=%d", cluster.MustFreePort(t)), "--webhook-service=",
	}, extra...)
	p, err := cluster.StartProcess("metrics-manager", t.TempDir(), cluster.MustHookwrightBinary(t), args, []string{"KUBECONFIG=" + kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	ctx := cluster.TestContext(t, 90*time.Second)
	// /healthz, not /readyz: with no read access its caches never sync, so
	// it is (rightly) never ready; its metrics server runs regardless.
	healthy := p.ProbeOK(probe, "/healthz")
	err = cluster.WaitFor(ctx, 90*time.Second, "manager /healthz", func(ctx context.Context) (bool, error) {
		if ok, err := healthy(ctx); !ok || err != nil {
			return false, err
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			return false, err
		}
		return true, c.Close()
	})
	if err != nil {
		t.Fatalf("%v\nlog:\n%s", err, p.Tail(3000))
	}
	return port
}
