package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/hookwright/hookwright/hack/demoenv"
	"github.com/hookwright/hookwright/hack/ociimage"
)

// Package is the OLM package of bundle/ (metadata/annotations.yaml).
const Package = "hookwright"

// catalogName is the CatalogSource `operator-sdk run bundle` creates
// (operator.CatalogNameForPackage): how an install of its own is told
// from one made from another catalog.
const catalogName = Package + "-catalog"

// pssLevel is the Pod Security level run bundle's namespace enforces:
// operator-sdk v1.42.2 creates the catalog's registry pod itself
// (internal/olm/operator/registry/fbcindex) with an init container that
// never gets a securityContext, and never sets runAsNonRoot (to suit
// OpenShift's uid ranges), so `restricted` refuses it even with
// --security-context-config restricted; `baseline` admits it (nothing
// privileged, no host namespaces or paths).
const pssLevel = "baseline"

// Settings are what the targets act on, from the Makefile's variables,
// the environment and, for what neither sets, the demo's env file.
type Settings struct {
	// Registry is IMAGE_REGISTRY (host[:port]); Insecure is
	// IMAGE_REGISTRY_INSECURE=true: TLS not verified, plain HTTP allowed.
	Registry string
	Insecure bool
	// Kubeconfig is KUBECONFIG ("" for client-go's default, ~/.kube/config).
	Kubeconfig string
	// SSLCertFile is SSL_CERT_FILE, for operator-sdk's image reads.
	SSLCertFile string
	// FromDemo names the variables taken from the demo's env file; the
	// commands printed carry them in front (VAR=value cmd).
	FromDemo []string
	// DemoEnv is the demo's env file path, "" when there is none.
	DemoEnv string

	Namespace string
	// Version is VERSION: the bundle to build, install or upgrade to.
	Version string
	// Operator and Bundle are the public names IMG and BUNDLE_IMG.
	Operator, Bundle string
	Timeout          time.Duration
}

// resolve fills Settings from the flags' values (s), the environment
// (getenv) and the demo's env file's variables (demo, nil if none).
func resolve(s Settings, getenv func(string) string, demo map[string]string) (Settings, error) {
	take := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
			return
		}
		if v := demo[name]; v != "" {
			*dst = v
			s.FromDemo = append(s.FromDemo, name)
		}
	}
	take(demoenv.ImageRegistry, &s.Registry)
	take(demoenv.Kubeconfig, &s.Kubeconfig)
	// The demo's registry is trusted through the demo's trust store, even
	// over an SSL_CERT_FILE of the environment: that store holds the CAs
	// of the SSL_CERT_FILE in force when the demo started (or the
	// system's) plus the registry's CA, so nothing is lost.
	if demo[demoenv.SSLCertFile] != "" && s.Registry != "" && s.Registry == demo[demoenv.ImageRegistry] {
		s.SSLCertFile = demo[demoenv.SSLCertFile]
		if getenv(demoenv.SSLCertFile) != s.SSLCertFile {
			s.FromDemo = append(s.FromDemo, demoenv.SSLCertFile)
		}
	} else {
		take(demoenv.SSLCertFile, &s.SSLCertFile)
	}
	switch v := getenv("IMAGE_REGISTRY_INSECURE"); v {
	case "", "false":
	case "true":
		s.Insecure = true
	default:
		return s, fmt.Errorf("IMAGE_REGISTRY_INSECURE=%q: want true or false", v)
	}
	if s.Namespace == "" || s.Version == "" || s.Operator == "" || s.Bundle == "" {
		return s, errors.New("namespace, version, IMG and BUNDLE_IMG are required")
	}
	if strings.HasPrefix(s.Version, "v") {
		return s, fmt.Errorf("VERSION=%s: give it without the v (VERSION=%s)", s.Version, s.Version[1:])
	}
	return s, nil
}

// env returns the environment of the commands run: base plus the
// variables taken from the demo's file.
func (s Settings) env(base []string) []string {
	out := append([]string(nil), base...)
	for _, k := range s.FromDemo {
		out = append(out, k+"="+s.value(k))
	}
	return out
}

func (s Settings) value(k string) string {
	switch k {
	case demoenv.ImageRegistry:
		return s.Registry
	case demoenv.Kubeconfig:
		return s.Kubeconfig
	case demoenv.SSLCertFile:
		return s.SSLCertFile
	}
	return ""
}

// Names are the image references the registry serves for Settings.
type Names struct {
	Bundle, Index, Operator string
}

// names returns where bundle-image pushes the images and what
// operator-sdk is given: each public name prefixed by the registry
// (ociimage.LocalReference), as the node's containerd resolves them.
func (s Settings) names() (Names, error) {
	if s.Registry == "" {
		return Names{}, errNoRegistry
	}
	var n Names
	for _, x := range []struct {
		dst *string
		ref string
	}{{&n.Bundle, s.Bundle}, {&n.Index, ociimage.IndexName}, {&n.Operator, s.Operator}} {
		r, err := ociimage.LocalReference(s.Registry, x.ref)
		if err != nil {
			return Names{}, err
		}
		*x.dst = r.String()
	}
	return n, nil
}

var errNoRegistry = errors.New("no registry: IMAGE_REGISTRY is empty and there is no demo env file; " +
	"start the demo (make demo) or give your registry: IMAGE_REGISTRY=host[:port]")

// sdkArgs are the operator-sdk arguments of each target.
func (s Settings) sdkArgs(target string, n Names) []string {
	timeout := s.Timeout.String()
	if s.Timeout%time.Minute == 0 {
		timeout = fmt.Sprintf("%dm", int(s.Timeout/time.Minute))
	}
	var args []string
	switch target {
	case "run":
		args = []string{"run", "bundle", n.Bundle, "--index-image", n.Index, "--namespace", s.Namespace,
			"--install-mode", "AllNamespaces", "--security-context-config", "restricted", "--timeout", timeout}
	case "upgrade":
		args = []string{"run", "bundle-upgrade", n.Bundle, "--namespace", s.Namespace, "--timeout", timeout}
	case "cleanup":
		return []string{"cleanup", Package, "--namespace", s.Namespace, "--timeout", timeout}
	}
	if s.Insecure {
		args = append(args, "--skip-tls-verify")
	}
	return args
}

// namespaceArgs are the kubectl commands that make the namespace ready for
// run bundle: created when missing, labelled pssLevel.
func (s Settings) namespaceArgs(exists bool) [][]string {
	var out [][]string
	if !exists {
		out = append(out, []string{"create", "namespace", s.Namespace})
	}
	return append(out, []string{"label", "--overwrite", "namespace", s.Namespace, "pod-security.kubernetes.io/enforce=" + pssLevel})
}

// commandLine is how a command is printed: the variables taken from the
// demo's file in front, then the program as given and its arguments, each
// quoted for a shell when it needs it.
func (s Settings) commandLine(program string, args []string) string {
	var parts []string
	for _, k := range s.FromDemo {
		if k != demoenv.ImageRegistry {
			parts = append(parts, k+"="+shellQuote(s.value(k)))
		}
	}
	parts = append(parts, program)
	for _, a := range args {
		parts = append(parts, shellQuote(a))
	}
	return strings.Join(parts, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@,+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Install is what the cluster holds of hookwright, as classify reads it.
type Install struct {
	// Subscriptions to the package, in any namespace.
	Subscriptions []Subscription
	// CRDs are the names of hookwright's CRDs that exist.
	CRDs []string
	// Deployments are operator Deployments not managed by OLM (no
	// olm.owner label), as namespace/name.
	Deployments []string
	// LeftCatalog is true when run bundle's CatalogSource exists in the
	// namespace without a Subscription (a failed run left it).
	LeftCatalog bool
	// CRs counts the SidecarInjectors and NodeOversells.
	CRs int
}

// Subscription is an OLM Subscription to the package.
type Subscription struct {
	Namespace, Name                 string
	CatalogNamespace, CatalogName   string
	InstalledCSV, CurrentCSV, State string
}

func (s Subscription) byRunBundle() bool {
	return s.CatalogName == catalogName && s.CatalogNamespace == s.Namespace
}

func (s Subscription) csv() string {
	if s.InstalledCSV != "" {
		return s.InstalledCSV
	}
	return s.CurrentCSV
}

// crdsGo says what deleting the CRDs takes with them.
func (in Install) crdsGo() string {
	return fmt.Sprintf("deletes the CRDs and with them every SidecarInjector and NodeOversell (%d now)", in.CRs)
}

// checkRun returns nil when nothing of hookwright is installed, else an
// error naming the install and what to run.
func (in Install) checkRun(ns string) error {
	for _, sub := range in.Subscriptions {
		flag := ""
		if sub.Namespace != ns {
			flag = " BUNDLE_NAMESPACE=" + sub.Namespace
		}
		if sub.byRunBundle() {
			return fmt.Errorf("hookwright is already installed by operator-sdk run bundle in %s (CSV %s): "+
				"upgrade it with make run-bundle-upgrade%s VERSION=x.y.z, or remove it first with make cleanup-bundle%s, which %s",
				sub.Namespace, sub.csv(), flag, flag, in.crdsGo())
		}
		return fmt.Errorf("hookwright is already installed by OLM from catalog %s/%s (Subscription %s/%s, CSV %s): "+
			"make cleanup-bundle%s removes it (operator-sdk cleanup: the Subscription, the CSV, that CatalogSource and the OperatorGroup), and %s",
			sub.CatalogNamespace, sub.CatalogName, sub.Namespace, sub.Name, sub.csv(), flag, in.crdsGo())
	}
	if len(in.Deployments) > 0 {
		return fmt.Errorf("hookwright is already installed from config/default (Deployment %s): "+
			"make undeploy removes it (the custom resources first, then the operator and the CRDs)", strings.Join(in.Deployments, ", "))
	}
	if len(in.CRDs) > 0 {
		return fmt.Errorf("hookwright's CRDs are installed without an operator (%s; make install?): "+
			"make uninstall removes them, and with them every SidecarInjector and NodeOversell (%d now); OLM creates them from the bundle",
			strings.Join(in.CRDs, ", "), in.CRs)
	}
	if in.LeftCatalog {
		return fmt.Errorf("CatalogSource %s/%s is left from an earlier run: make cleanup-bundle removes it", ns, catalogName)
	}
	return nil
}

// checkUpgrade returns the Subscription run bundle made in ns, or an error
// naming what is there instead and what to run.
func (in Install) checkUpgrade(ns, wantCSV string) (Subscription, error) {
	for _, sub := range in.Subscriptions {
		switch {
		case sub.Namespace != ns && sub.byRunBundle():
			return sub, fmt.Errorf("hookwright is installed by run bundle in %s, not %s: make run-bundle-upgrade BUNDLE_NAMESPACE=%s", sub.Namespace, ns, sub.Namespace)
		case sub.Namespace != ns:
			continue
		case !sub.byRunBundle():
			return sub, fmt.Errorf("hookwright in %s was installed from catalog %s/%s (Subscription %s), which upgrades it along its channel; "+
				"run-bundle-upgrade only upgrades an install of make run-bundle (make cleanup-bundle then make run-bundle to switch; cleanup %s)",
				ns, sub.CatalogNamespace, sub.CatalogName, sub.Name, in.crdsGo())
		case sub.csv() == wantCSV:
			return sub, fmt.Errorf("hookwright in %s already runs %s: nothing to upgrade (a newer VERSION=x.y.z after make bundle-image VERSION=x.y.z)", ns, wantCSV)
		}
		return sub, nil
	}
	if len(in.Deployments) > 0 {
		return Subscription{}, fmt.Errorf("hookwright is installed from config/default (Deployment %s), not by run bundle: make undeploy, then make run-bundle", strings.Join(in.Deployments, ", "))
	}
	return Subscription{}, fmt.Errorf("no run bundle install of hookwright in %s to upgrade: make run-bundle first", ns)
}

// checkCleanup returns whether there is an OLM install (or run bundle's
// leftovers) in ns to clean up; an error names an install it cannot
// remove and what to run instead.
func (in Install) checkCleanup(ns string) (bool, error) {
	for _, sub := range in.Subscriptions {
		if sub.Namespace == ns {
			return true, nil
		}
	}
	if in.LeftCatalog {
		return true, nil
	}
	for _, sub := range in.Subscriptions {
		return false, fmt.Errorf("hookwright is installed through OLM in %s, not %s: make cleanup-bundle BUNDLE_NAMESPACE=%s", sub.Namespace, ns, sub.Namespace)
	}
	if len(in.Deployments) > 0 {
		return false, fmt.Errorf("hookwright is installed from config/default (Deployment %s), not through OLM: make undeploy removes it", strings.Join(in.Deployments, ", "))
	}
	return false, nil
}

// csvName is the CSV of version v of the package.
func csvName(v string) string { return Package + ".v" + v }

// registryError says what a failed registry request means for the user.
func registryError(registry string, err error) error {
	var opErr *net.OpError
	var unknownCA x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	var terr *transport.Error
	switch {
	case errors.As(err, &unknownCA), errors.As(err, &verify):
		return fmt.Errorf("registry %s: its certificate is not trusted (%v): put its CA in SSL_CERT_FILE (the demo's env file does: . _demo/env), "+
			"or IMAGE_REGISTRY_INSECURE=true to skip verification", registry, err)
	case errors.As(err, &recordErr) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("registry %s serves plain HTTP: operator-sdk reads the bundle and index images over HTTPS only; "+
			"give the registry's HTTPS address (the demo's: . _demo/env sets IMAGE_REGISTRY)", registry)
	case errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &opErr) && opErr.Op == "dial"):
		return fmt.Errorf("registry %s is unreachable (%v): is the demo running (make demo; its registry changes with each start, . _demo/env), or is IMAGE_REGISTRY right?", registry, err)
	case errors.As(err, &terr) && terr.StatusCode == 404:
		return fmt.Errorf("%w: not in the registry %s: make bundle-image first (with the same VERSION)", err, registry)
	}
	return fmt.Errorf("registry %s: %w", registry, err)
}

// clusterError says what a failed first request to the cluster means.
func clusterError(host, kubeconfig string, err error) error {
	where := "KUBECONFIG=" + kubeconfig
	if kubeconfig == "" {
		where = "client-go's default kubeconfig (~/.kube/config)"
	}
	return fmt.Errorf("no cluster at %s (%s): %v; start the demo (make demo) or point KUBECONFIG at your cluster", host, where, err)
}

// noOLM is the error when the cluster serves no OLM API.
func noOLM(host string) error {
	return fmt.Errorf("OLM is not installed on the cluster at %s (it serves no operators.coreos.com/v1alpha1): "+
		"operator-sdk olm install installs it (from the internet); the demo runs it from scenario 5 on", host)
}

// demoEnvFile returns the demo's env file in dir and its variables, or
// "" and nil when it does not exist.
func demoEnvFile(dir string) (string, map[string]string, error) {
	p := filepath.Join(dir, demoenv.FileName)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	vars, err := demoenv.Parse(b)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", p, err)
	}
	return p, vars, nil
}
