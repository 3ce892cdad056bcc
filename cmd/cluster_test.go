package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// mainArgsEnv makes the test binary run main with these arguments (JSON)
// instead of the tests: runMain's child process.
const mainArgsEnv = "HOOKWRIGHT_TEST_MAIN_ARGS"

func TestMain(m *testing.M) {
	if pluginName(os.Args[0]) {
		// Run by kubectl as its plugin (TestKubectlPlugin links this
		// test binary as kubectl-hookwright): be the CLI.
		main()
		os.Exit(0)
	}
	if raw, ok := os.LookupEnv(mainArgsEnv); ok {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Args = append([]string{"hookwright"}, args...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runMain runs hookwright's main with args in a child process, as a user
// would run the binary: its output and exit code.
func runMain(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mainArgsEnv+"="+string(raw))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// clusterAt is the client builder of a kubeconfig file and context, as
// the flags would set it.
func clusterAt(kubeconfig, context string) clusterFlags {
	return clusterFlags{flags: &genericclioptions.ConfigFlags{KubeConfig: &kubeconfig, Context: &context}}
}

// fakeAPIServer answers just enough of the Kubernetes API for the CLI:
// /version, discovery of core/v1 and admission.hookwright.io/v1alpha1,
// the objects it holds, an empty list for any other collection and 404
// for any other object. It records every request ("GET /api/v1/nodes").
type fakeAPIServer struct {
	*httptest.Server
	objects map[string]string // by path

	mu       sync.Mutex
	requests []string
}

// fakeKinds are the resources fakeAPIServer serves, by plural.
var fakeKinds = map[string]struct {
	kind, groupVersion string
	namespaced         bool
}{
	"nodes":            {"Node", "v1", false},
	"namespaces":       {"Namespace", "v1", false},
	"pods":             {"Pod", "v1", true},
	"secrets":          {"Secret", "v1", true},
	"sidecarinjectors": {"SidecarInjector", "admission.hookwright.io/v1alpha1", false},
	"nodeoversells":    {"NodeOversell", "admission.hookwright.io/v1alpha1", false},
}

func newFakeAPIServer(t *testing.T, version string, objects map[string]string) *fakeAPIServer {
	t.Helper()
	s := &fakeAPIServer{objects: objects}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	resources := func(gv string) string {
		var rs []string
		for plural, k := range fakeKinds {
			if k.groupVersion == gv {
				rs = append(rs, fmt.Sprintf(`{"name":%q,"singularName":"","namespaced":%t,"kind":%q,"verbs":["get","list","patch"]}`, plural, k.namespaced, k.kind))
			}
		}
		return fmt.Sprintf(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":%q,"resources":[%s]}`, gv, strings.Join(rs, ","))
	}
	s.objects["/version"] = fmt.Sprintf(`{"major":"1","minor":"37","gitVersion":%q}`, version)
	s.objects["/api"] = `{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1"}]}`
	s.objects["/apis"] = `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"admission.hookwright.io",` +
		`"versions":[{"groupVersion":"admission.hookwright.io/v1alpha1","version":"v1alpha1"}],` +
		`"preferredVersion":{"groupVersion":"admission.hookwright.io/v1alpha1","version":"v1alpha1"}}]}`
	s.objects["/api/v1"] = resources("v1")
	s.objects["/apis/admission.hookwright.io/v1alpha1"] = resources("admission.hookwright.io/v1alpha1")
	return s
}

func (s *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r.Method+" "+r.URL.Path)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if b, ok := s.objects[r.URL.Path]; ok {
		_, _ = w.Write([]byte(b))
		return
	}
	rest, _ := strings.CutPrefix(r.URL.Path, "/api/v1/")
	rest, _ = strings.CutPrefix(rest, "/apis/admission.hookwright.io/v1alpha1/")
	segs := strings.Split(rest, "/")
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	k, known := fakeKinds[segs[0]]
	if known && len(segs) == 1 && r.Method == http.MethodGet {
		fmt.Fprintf(w, `{"kind":"%sList","apiVersion":%q,"metadata":{},"items":[]}`, k.kind, k.groupVersion)
		return
	}
	name := segs[len(segs)-1]
	status, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
		"message": fmt.Sprintf("%s %q not found", segs[0], name), "details": map[string]string{"name": name, "kind": segs[0]}})
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write(status)
}

// dialed returns the requests since the last call and forgets them.
func (s *fakeAPIServer) dialed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.requests
	s.requests = nil
	return out
}

// twoClusters is a kubeconfig with contexts one (the current one) and two,
// each pointing at its own fake API server holding a node kwok-node-0
// (4 CPUs on one, 8 on two) and the CA Secret in namespace lab-ops.
func twoClusters(t *testing.T) (kubeconfig string, one, two *fakeAPIServer) {
	t.Helper()
	node := func(cpu string) string {
		return fmt.Sprintf(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"kwok-node-0"},"status":{"capacity":{"cpu":%q,"memory":"8Gi"},"allocatable":{"cpu":%q,"memory":"8Gi"}}}`, cpu, cpu)
	}
	objects := func(cpu string) map[string]string {
		return map[string]string{
			"/api/v1/nodes/kwok-node-0":                        node(cpu),
			"/api/v1/namespaces/lab-ops/secrets/hookwright-ca": `{"kind":"Secret","apiVersion":"v1","metadata":{"name":"hookwright-ca","namespace":"lab-ops"}}`,
		}
	}
	one = newFakeAPIServer(t, "v1.37.1", objects("4"))
	two = newFakeAPIServer(t, "v1.37.2", objects("8"))
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: %q}
- name: two
  cluster: {server: %q}
users:
- name: u
  user: {token: t}
contexts:
- name: one
  context: {cluster: one, user: u}
- name: two
  context: {cluster: two, user: u}
current-context: one
`, one.URL, two.URL)
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, one, two
}

// noAmbientCluster makes the tests blind to the machine's own kubeconfig
// and in-cluster service account.
func noAmbientCluster(t *testing.T) {
	t.Helper()
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

// execute runs the root command with args in this process.
func execute(args ...string) (string, error) {
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestCommandsDialTheContext: explain-node, rotate-ca and status dial the
// cluster of --context, else the kubeconfig's current context, from
// --kubeconfig or $KUBECONFIG, and nothing else; rotate-ca's -n picks the
// Secret's namespace.
func TestCommandsDialTheContext(t *testing.T) {
	noAmbientCluster(t)
	kc, one, two := twoClusters(t)
	servers := map[string]*fakeAPIServer{"one": one, "two": two}
	commands := []struct {
		args []string
		// want is in the output; wantRequest was sent.
		want        func(server string) string
		wantRequest string
	}{
		{[]string{"explain-node", "kwok-node-0"}, func(s string) string {
			return map[string]string{"one": "cpu 4", "two": "cpu 8"}[s]
		}, "GET /api/v1/nodes/kwok-node-0"},
		{[]string{"rotate-ca", "-n", "lab-ops"}, func(string) string {
			return "secret lab-ops/hookwright-ca annotated admission.hookwright.io/rotate-ca="
		}, "PATCH /api/v1/namespaces/lab-ops/secrets/hookwright-ca"},
		{[]string{"status"}, func(string) string { return "no SidecarInjectors" },
			"GET /apis/admission.hookwright.io/v1alpha1/sidecarinjectors"},
	}
	for _, c := range commands {
		for _, tc := range []struct {
			name, server string
			flags        []string
			kubeconfig   string // $KUBECONFIG
		}{
			{"current context", "one", []string{"--kubeconfig", kc}, ""},
			{"--context two", "two", []string{"--kubeconfig", kc, "--context", "two"}, ""},
			{"--context one", "one", []string{"--kubeconfig", kc, "--context", "one"}, ""},
			{"$KUBECONFIG --context two", "two", []string{"--context", "two"}, kc},
		} {
			t.Setenv("KUBECONFIG", tc.kubeconfig)
			out, err := execute(append(slices.Clone(c.args), tc.flags...)...)
			if err != nil {
				t.Errorf("%v %s: %v\n%s", c.args, tc.name, err, out)
			}
			if w := c.want(tc.server); !strings.Contains(out, w) {
				t.Errorf("%v %s: output lacks %q:\n%s", c.args, tc.name, w, out)
			}
			for name, s := range servers {
				got := s.dialed()
				switch {
				case name == tc.server && !slices.Contains(got, c.wantRequest):
					t.Errorf("%v %s: server %s got %v, want %q among them", c.args, tc.name, name, got, c.wantRequest)
				case name != tc.server && len(got) > 0:
					t.Errorf("%v %s: server %s dialed: %v", c.args, tc.name, name, got)
				}
			}
		}
	}
	t.Setenv("KUBECONFIG", "")
	if _, err := execute("explain-node", "kwok-node-0", "--kubeconfig", kc, "--context", "three"); err == nil || !strings.Contains(err.Error(), `context "three"`) {
		t.Errorf("unknown context: %v", err)
	}
	if out, err := execute("explain-node", "kwok-node-0", "--kubeconfig", kc, "--context", "two", "-o", "jsonpath={.node} {.lines[?(@.name==\"capacity\")].value}"); err != nil || out != "kwok-node-0 cpu 8, memory 8Gi" {
		t.Errorf("explain-node -o jsonpath: %q, %v", out, err)
	}
	if out, err := execute("rotate-ca"); err == nil || !strings.Contains(err.Error(), "no cluster configured") {
		t.Errorf("no kubeconfig: %v\n%s", err, out)
	}
}

// How a command reaches a cluster, for TestClusterFlagsEverywhere.
const (
	// kubectlFlags: every kubectl flag, from clusterFlags.addFlags.
	kubectlFlags = iota
	// serverFlags: --kubeconfig and --context only, from
	// clusterFlags.addServerFlags (the servers; their namespace flags are
	// their own).
	serverFlags
	// noCluster: the command never dials a cluster.
	noCluster
)

// commandClusterFlags is every command of the tree: how it reaches a
// cluster and, for kubectl's flags, -n's default ("" none: cluster-scoped
// objects). A new command must be added here.
var commandClusterFlags = map[string]struct {
	flags int
	ns    string
}{
	"check": {kubectlFlags, "hookwright-system"}, "rotate-ca": {kubectlFlags, "hookwright-system"},
	"check-inject": {kubectlFlags, "default"}, "kube-inject": {kubectlFlags, "default"},
	"status": {kubectlFlags, ""}, "explain-node": {kubectlFlags, ""}, "renew-certificate": {kubectlFlags, ""},
	"manager": {serverFlags, ""}, "injector": {serverFlags, ""}, "oversell": {serverFlags, ""},
	"version": {noCluster, ""},
}

// TestClusterFlagsEverywhere: every command of the tree takes
// --kubeconfig and --context from the one ConfigFlags builder: the CLI
// commands all of kubectl's flags (--as, --server, ...) and -n where they
// have a namespace, with their own default; the servers only --kubeconfig
// and --context.
func TestClusterFlagsEverywhere(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	kubectl := []string{"kubeconfig", "context", "cluster", "user", "as", "as-group", "server", "token", "request-timeout"}
	seen := map[string]bool{}
	var walk func(*cobra.Command)
	walk = func(parent *cobra.Command) {
		for _, cmd := range parent.Commands() {
			walk(cmd)
			name := cmd.CommandPath()
			want, ok := commandClusterFlags[strings.TrimPrefix(name, "hookwright ")]
			if !ok {
				t.Errorf("%s is not in commandClusterFlags: say how it reaches a cluster", name)
				continue
			}
			seen[cmd.Name()] = true
			has := func(f string) bool { return cmd.Flags().Lookup(f) != nil }
			for _, f := range kubectl {
				switch {
				case want.flags == kubectlFlags && !has(f):
					t.Errorf("%s lacks --%s", name, f)
				case want.flags == serverFlags && (f == "kubeconfig" || f == "context") && !has(f):
					t.Errorf("%s lacks --%s", name, f)
				case want.flags == serverFlags && f != "kubeconfig" && f != "context" && f != "request-timeout" && has(f):
					// (The webhook servers' --request-timeout is their
					// listener's own bound on a review.)
					t.Errorf("%s, a server, has kubectl's --%s", name, f)
				case want.flags == noCluster && has(f):
					t.Errorf("%s dials no cluster but has --%s", name, f)
				}
			}
			if want.flags != kubectlFlags {
				continue
			}
			ns := cmd.Flags().Lookup("namespace")
			switch {
			case want.ns == "" && ns != nil:
				t.Errorf("%s has -n on cluster-scoped objects", name)
			case want.ns != "" && (ns == nil || ns.Shorthand != "n" || ns.DefValue != want.ns):
				t.Errorf("%s: -n %+v, want default %q", name, ns, want.ns)
			}
		}
	}
	walk(newRootCommand())
	for name := range commandClusterFlags {
		if !seen[name] {
			t.Errorf("%s is in commandClusterFlags but not in the command tree", name)
		}
	}
}

// TestWrongContextFails: in every command family that dials a cluster,
// a --context the kubeconfig lacks is one clear error line on stderr and
// exit code 1, before anything is read or served; no panic, nothing on
// stdout.
func TestWrongContextFails(t *testing.T) {
	noAmbientCluster(t)
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	pod := filepath.Join(dir, "pod.yaml")
	cr := filepath.Join("..", "config", "samples", "admission_v1alpha1_sidecarinjector.yaml")
	for f, content := range map[string]string{kc: twoContexts, pod: "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: a, image: a}]\n"} {
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const want = "error: loading kubeconfig: context \"nope\" does not exist\n"
	families := [][]string{
		{"status"}, {"status", "web"}, {"status", "--what-if", "-f", cr},
		{"check-inject", "-f", pod}, {"check-inject", "web"}, {"check-inject", "--live", "web"},
		{"kube-inject", "--injector", "sidecar-injector", "-f", pod},
		{"explain-node", "node-0"},
		{"rotate-ca"}, {"renew-certificate", "sidecarinjector/web"},
		{"check"}, {"check", "--pre"},
		// The servers fail before they bind or serve anything.
		{"manager", "--metrics-bind-address=0", "--health-probe-bind-address=0"},
		{"injector", "--metrics-bind-address=0", "--health-probe-bind-address=0"},
		{"oversell", "--metrics-bind-address=0", "--health-probe-bind-address=0"},
	}
	tested := map[string]bool{}
	for _, args := range families {
		tested[args[0]] = true
		stdout, stderr, code := runMain(t, append(args, "--kubeconfig", kc, "--context", "nope")...)
		got := stderr
		if commandClusterFlags[args[0]].flags == serverFlags {
			// The servers log their settings first.
			got = stderr[strings.LastIndex(strings.TrimSuffix(stderr, "\n"), "\n")+1:]
		}
		if code != 1 || got != want || stdout != "" {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want exit 1 and stderr %q", args, code, stderr, stdout, want)
		}
		if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
			t.Errorf("%v panicked:\n%s", args, stderr)
		}
	}
	for name, c := range commandClusterFlags {
		if c.flags != noCluster && !tested[name] {
			t.Errorf("%s dials a cluster and has no wrong --context case", name)
		}
	}
}

// TestMissingInjectorExits: a SidecarInjector the cluster lacks, or a
// --config file that is not there, is one clear error line on stderr and
// exit code 1, with no stack trace; the cluster asked is --context's.
func TestMissingInjectorExits(t *testing.T) {
	noAmbientCluster(t)
	kc, one, two := twoClusters(t)
	dir := t.TempDir()
	pod := filepath.Join(dir, "pod.yaml")
	if err := os.WriteFile(pod, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: a, image: a}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "nope.yaml")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check-inject", "--kubeconfig", kc, "--context", "two", "--injector", "nope", "-f", pod},
			"error: SidecarInjector nope not found in the cluster\n"},
		{[]string{"kube-inject", "--kubeconfig", kc, "--context", "two", "--injector", "nope", "-f", pod},
			"error: SidecarInjector nope not found in the cluster\n"},
		{[]string{"status", "nope", "--kubeconfig", kc, "--context", "two"},
			"error: SidecarInjector nope not found in the cluster\n"},
		{[]string{"kube-inject", "--config", missing, "-f", pod},
			"error: open " + missing + ": no such file or directory\n"},
		{[]string{"status", "--what-if", "-f", missing, "--kubeconfig", kc, "--context", "two"},
			"error: open " + missing + ": no such file or directory\n"},
	} {
		stdout, stderr, code := runMain(t, tc.args...)
		if code != 1 || stderr != tc.want || stdout != "" {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want exit 1, stderr %q", tc.args, code, stderr, stdout, tc.want)
		}
	}
	if got := one.dialed(); len(got) > 0 {
		t.Errorf("current context dialed despite --context two: %v", got)
	}
	if got := two.dialed(); !slices.Contains(got, "GET /apis/admission.hookwright.io/v1alpha1/sidecarinjectors/nope") {
		t.Errorf("context two: %v", got)
	}
}

// TestLoadInjectors: the one loader reads a file without the cluster, or
// the cluster's named or every SidecarInjector, with a clear error for a
// missing one, an empty cluster and a file that is not a SidecarInjector.
func TestLoadInjectors(t *testing.T) {
	noAmbientCluster(t)
	si := sampleInjector(t)
	other := si.DeepCopy()
	other.Name = "other"
	names := func(src *injectorSource, q injectorQuery) (string, error) {
		crs, err := src.loadInjectors(t.Context(), q)
		var ns []string
		for _, cr := range crs {
			ns = append(ns, cr.Name)
		}
		return strings.Join(ns, ","), err
	}
	full := &injectorSource{client: fakeCluster(t, si, other)}
	empty := &injectorSource{client: fakeCluster(t)}
	// No client and no kubeconfig: dialing would fail.
	offline := &injectorSource{}
	dir := t.TempDir()
	cr := filepath.Join(dir, "cr.yaml")
	b, err := os.ReadFile(filepath.Join("..", "config", "samples", "admission_v1alpha1_sidecarinjector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	podFile := filepath.Join(dir, "pod.yaml")
	for f, content := range map[string]string{cr: string(b), podFile: "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\n"} {
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		src     *injectorSource
		q       injectorQuery
		want    string
		wantErr *regexp.Regexp
	}{
		{"every one", full, injectorQuery{}, "other,sidecar-injector", nil},
		{"named, in order", full, injectorQuery{names: []string{"sidecar-injector", "other"}}, "sidecar-injector,other", nil},
		{"missing", full, injectorQuery{names: []string{"sidecar-injector", "nope"}}, "",
			regexp.MustCompile(`^SidecarInjector nope not found in the cluster$`)},
		{"missing allowed", full, injectorQuery{names: []string{"nope"}, missingOK: true}, "", nil},
		{"empty cluster", empty, injectorQuery{}, "", regexp.MustCompile(`^no SidecarInjector in the cluster$`)},
		{"empty cluster allowed", empty, injectorQuery{noneOK: true}, "", nil},
		{"file, offline", offline, injectorQuery{file: cr}, "sidecar-injector", nil},
		{"file wins over the cluster", full, injectorQuery{file: cr, names: []string{"other"}}, "sidecar-injector", nil},
		{"file missing", offline, injectorQuery{file: filepath.Join(dir, "nope.yaml")}, "",
			regexp.MustCompile(`^open .*/nope\.yaml: no such file or directory$`)},
		{"file not a SidecarInjector", offline, injectorQuery{file: podFile}, "",
			regexp.MustCompile(`^.*/pod\.yaml: not a SidecarInjector: got apiVersion "v1" kind "Pod"`)},
		{"no cluster", offline, injectorQuery{names: []string{"sidecar-injector"}}, "",
			regexp.MustCompile(`^no cluster configured: use --config FILE to work offline`)},
	} {
		got, err := names(tc.src, tc.q)
		switch {
		case tc.wantErr == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantErr != nil && (err == nil || !tc.wantErr.MatchString(err.Error())):
			t.Errorf("%s: error %v, want %s", tc.name, err, tc.wantErr)
		case got != tc.want:
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}
