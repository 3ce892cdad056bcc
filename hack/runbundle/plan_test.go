package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

func settings(t *testing.T, env, demo map[string]string) Settings {
	t.Helper()
	s, err := resolve(Settings{Namespace: "hookwright-system", Version: "0.1.0", Timeout: 5 * time.Minute,
		Operator: "ghcr.io/hookwright/hookwright:v0.1.0", Bundle: "ghcr.io/hookwright/hookwright-bundle:v0.1.0"},
		func(k string) string { return env[k] }, demo)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The environment wins over the demo's file; what comes from the file is
// printed in front of the commands (but the registry, which is only in
// their arguments).
func TestResolveAndCommandLine(t *testing.T) {
	demo := map[string]string{"KUBECONFIG": "/d/_demo/kubeconfig", "SSL_CERT_FILE": "/d/_demo/registry/trust.pem", "IMAGE_REGISTRY": "127.0.0.1:40001"}
	s := settings(t, map[string]string{"KUBECONFIG": "/mine", "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}, demo)
	if s.Kubeconfig != "/mine" || s.Registry != "127.0.0.1:40001" || s.SSLCertFile != demo["SSL_CERT_FILE"] ||
		strings.Join(s.FromDemo, ",") != "IMAGE_REGISTRY,SSL_CERT_FILE" {
		t.Errorf("resolved %+v", s)
	}
	// Another registry keeps the environment's trust store.
	if mine := settings(t, map[string]string{"IMAGE_REGISTRY": "reg.example.com", "SSL_CERT_FILE": "/corp.pem"}, demo); mine.SSLCertFile != "/corp.pem" || mine.Kubeconfig != demo["KUBECONFIG"] {
		t.Errorf("own registry: %+v", mine)
	}
	n, err := s.names()
	if err != nil {
		t.Fatal(err)
	}
	want := Names{
		Bundle:   "127.0.0.1:40001/ghcr.io/hookwright/hookwright-bundle:v0.1.0",
		Index:    "127.0.0.1:40001/ghcr.io/hookwright/hookwright-index:empty",
		Operator: "127.0.0.1:40001/ghcr.io/hookwright/hookwright:v0.1.0",
	}
	if n != want {
		t.Errorf("names %+v, want %+v", n, want)
	}
	got := s.commandLine("bin/operator-sdk", s.sdkArgs("run", n))
	if w := "SSL_CERT_FILE=/d/_demo/registry/trust.pem bin/operator-sdk run bundle " + want.Bundle + " --index-image " + want.Index +
		" --namespace hookwright-system --install-mode AllNamespaces --security-context-config restricted --timeout 5m"; got != w {
		t.Errorf("run:\n got %s\nwant %s", got, w)
	}
	env := s.env([]string{"PATH=/bin"})
	if strings.Join(env, " ") != "PATH=/bin IMAGE_REGISTRY=127.0.0.1:40001 SSL_CERT_FILE=/d/_demo/registry/trust.pem" {
		t.Errorf("env %v", env)
	}
	if q := shellQuote("it's a b"); q != `'it'\''s a b'` {
		t.Errorf("shellQuote = %s", q)
	}

	insecure := settings(t, map[string]string{"IMAGE_REGISTRY": "reg.example.com", "IMAGE_REGISTRY_INSECURE": "true"}, nil)
	n, _ = insecure.names()
	if got := strings.Join(insecure.sdkArgs("upgrade", n), " "); got != "run bundle-upgrade reg.example.com/ghcr.io/hookwright/hookwright-bundle:v0.1.0 --namespace hookwright-system --timeout 5m --skip-tls-verify" {
		t.Errorf("insecure upgrade: %s", got)
	}
	if _, err := settings(t, nil, nil).names(); !errors.Is(err, errNoRegistry) {
		t.Errorf("no registry: %v", err)
	}
	for _, bad := range []map[string]string{{"IMAGE_REGISTRY_INSECURE": "yes"}} {
		if _, err := resolve(Settings{Namespace: "n", Version: "0.1.0", Operator: "o", Bundle: "b"}, func(k string) string { return bad[k] }, nil); err == nil {
			t.Errorf("resolve(%v) accepted", bad)
		}
	}
	if _, err := resolve(Settings{Namespace: "n", Version: "v0.1.1", Operator: "o", Bundle: "b"}, func(string) string { return "" }, nil); err == nil {
		t.Error("VERSION=v0.1.1 accepted")
	}
}

// Which install is there decides what each target does or says.
func TestCheckInstall(t *testing.T) {
	const ns = "hookwright-system"
	rb := Subscription{Namespace: ns, Name: "hookwright-v0-1-0-sub", CatalogNamespace: ns, CatalogName: catalogName, InstalledCSV: "hookwright.v0.1.0"}
	cat := Subscription{Namespace: ns, Name: "hookwright", CatalogNamespace: "olm", CatalogName: "hookwright", InstalledCSV: "hookwright.v0.1.0"}
	other := rb
	other.Namespace, other.CatalogNamespace = "elsewhere", "elsewhere"
	for _, c := range []struct {
		name                string
		in                  Install
		run, upgrade, clean string // "" for ok, else a substring of the error
		cleanFound          bool
	}{
		{name: "nothing", upgrade: "make run-bundle first"},
		{name: "run bundle", in: Install{Subscriptions: []Subscription{rb}, CRDs: crdNames, CRs: 2},
			run: "make run-bundle-upgrade VERSION=x.y.z, or remove it first with make cleanup-bundle, which deletes the CRDs and with them every SidecarInjector and NodeOversell (2 now)", cleanFound: true},
		{name: "catalog", in: Install{Subscriptions: []Subscription{cat}, CRDs: crdNames, CRs: 3},
			run: "installed by OLM from catalog olm/hookwright (Subscription hookwright-system/hookwright", upgrade: "upgrades it along its channel", cleanFound: true},
		{name: "other namespace", in: Install{Subscriptions: []Subscription{other}},
			run: "make cleanup-bundle BUNDLE_NAMESPACE=elsewhere", upgrade: "BUNDLE_NAMESPACE=elsewhere", clean: "make cleanup-bundle BUNDLE_NAMESPACE=elsewhere"},
		{name: "make deploy", in: Install{Deployments: []string{ns + "/" + operatorDeployment}, CRDs: crdNames},
			run: "make undeploy", upgrade: "make undeploy", clean: "make undeploy"},
		{name: "CRDs only", in: Install{CRDs: crdNames[:1]}, run: "make uninstall", upgrade: "make run-bundle first"},
		{name: "failed run left its catalog", in: Install{LeftCatalog: true}, run: "make cleanup-bundle removes it", upgrade: "make run-bundle first", cleanFound: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			match := func(what string, err error, want string) {
				t.Helper()
				if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
					t.Errorf("%s: %v, want %q", what, err, want)
				}
			}
			match("run", c.in.checkRun(ns), c.run)
			_, err := c.in.checkUpgrade(ns, "hookwright.v0.1.1")
			match("upgrade", err, c.upgrade)
			found, err := c.in.checkCleanup(ns)
			match("cleanup", err, c.clean)
			if found != c.cleanFound {
				t.Errorf("cleanup found %v, want %v", found, c.cleanFound)
			}
		})
	}
	in := Install{Subscriptions: []Subscription{rb}}
	if _, err := in.checkUpgrade(ns, "hookwright.v0.1.0"); err == nil || !strings.Contains(err.Error(), "already runs hookwright.v0.1.0") {
		t.Errorf("upgrade to the installed version: %v", err)
	}
}

func TestRegistryError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, "is unreachable"},
		{fmt.Errorf("x: %w", &transport.Error{StatusCode: 404}), "make bundle-image first"},
		{errors.New("Get \"https://127.0.0.1:1/v2/\": http: server gave HTTP response to HTTPS client"), "serves plain HTTP"},
		{errors.New("other"), "registry r: other"},
	} {
		if got := registryError("r", c.err).Error(); !strings.Contains(got, c.want) {
			t.Errorf("registryError(%v) = %s, want %q", c.err, got, c.want)
		}
	}
}

// The by-hand block of docs/install.md (the README's install page) is
// exactly what the targets print, with the demo's registry as
// $IMAGE_REGISTRY and the tools on PATH (the env file puts bin/ there).
func TestREADMEShowsTheCommandsRun(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- hack/runbundle prints these -->\n```sh\n(.*?)```").FindSubmatch(raw)
	if m == nil {
		t.Fatal("docs/install.md has no block after <!-- hack/runbundle prints these -->")
	}
	var readme []string
	for _, l := range strings.Split(string(m[1]), "\n") {
		if l = strings.TrimSpace(strings.SplitN(l, " #", 2)[0]); l != "" && !strings.HasPrefix(l, ". ") {
			readme = append(readme, l)
		}
	}
	const reg = "127.0.0.1:40001"
	s := settings(t, map[string]string{"IMAGE_REGISTRY": reg}, nil)
	up := s
	up.Version, up.Bundle, up.Operator = "0.1.1", "ghcr.io/hookwright/hookwright-bundle:v0.1.1", "ghcr.io/hookwright/hookwright:v0.1.1"
	n, _ := s.names()
	nu, _ := up.names()
	var want []string
	for _, args := range s.namespaceArgs(true) {
		want = append(want, s.commandLine("kubectl", args))
	}
	want = append(want,
		s.commandLine("operator-sdk", s.sdkArgs("run", n)),
		up.commandLine("operator-sdk", up.sdkArgs("upgrade", nu)),
		s.commandLine("operator-sdk", s.sdkArgs("cleanup", n)),
		s.commandLine("kubectl", []string{"-n", s.Namespace, "delete", "operatorgroups.operators.coreos.com", "--ignore-not-found", "operator-sdk-og"}),
		s.commandLine("kubectl", []string{"delete", "operators.operators.coreos.com", olmOperatorName(s.Namespace), "--ignore-not-found"}))
	got := strings.ReplaceAll(strings.Join(readme, "\n"), "$IMAGE_REGISTRY", reg)
	if w := strings.Join(want, "\n"); got != w {
		t.Errorf("docs/install.md block:\n%s\nwhat hack/runbundle runs:\n%s", got, w)
	}
}
