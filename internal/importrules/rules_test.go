package importrules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/hookwright/hookwright"

// forbidden is a kind of dependency, by import path prefix (a path or any
// package below it).
type forbidden struct {
	what  string
	paths []string
}

var (
	clients = forbidden{"a Kubernetes client", []string{
		"k8s.io/client-go/kubernetes", "k8s.io/client-go/rest", "k8s.io/client-go/informers",
		"k8s.io/client-go/dynamic", "k8s.io/client-go/tools/cache",
		"sigs.k8s.io/controller-runtime/pkg/client", "sigs.k8s.io/controller-runtime/pkg/cache",
		"sigs.k8s.io/controller-runtime/pkg/manager",
	}}
	operator = forbidden{"the operator", []string{mod + "/controllers", mod + "/cmd"}}
	images   = forbidden{"image or dev tooling", []string{mod + "/hack", "github.com/google/go-containerregistry"}}
	harness  = forbidden{"the test harness", []string{mod + "/test"}}
	sidecar  = forbidden{"the sidecar engine", []string{mod + "/webhooks/sidecar"}}
	oversell = forbidden{"the oversell engine", []string{mod + "/webhooks/oversell"}}
	servers  = forbidden{"a webhook server", []string{mod + "/webhooks"}}
	internal = forbidden{"an internal/ package", []string{mod + "/internal"}}
	// ours is any hookwright package but the one checked.
	ours = forbidden{"another hookwright package", []string{mod}}
)

// rule is what one package's doc forbids in its dependency closure.
type rule struct {
	pkg string // below mod
	// doc is the package doc's own words.
	doc  string
	deny []forbidden
	// allow are paths exempt from deny (api/v1alpha1 for the engines).
	allow []string
	// stdOnly: the closure is the standard library and the package itself.
	stdOnly bool
	// shell: an I/O shell, which may use a Kubernetes client; the rest of
	// the base rule holds.
	shell bool
}

// pure is every package whose doc makes it pure or bounds what it may
// import. Every one also gets the base rule: no client (but for a shell),
// operator, image tooling or test harness.
var pure = []rule{
	{pkg: "api/v1alpha1", doc: "it must not import any other hookwright package, nor a Kubernetes client", deny: []forbidden{ours}},
	{pkg: "webhooks/sidecar", doc: "nor anything that links a Kubernetes client: it uses api/v1alpha1, webhooks/serving and webhooks/jsonscan only",
		deny: []forbidden{oversell, internal, ours}, allow: []string{mod + "/api/v1alpha1", mod + "/webhooks/serving", mod + "/webhooks/jsonscan"}},
	{pkg: "webhooks/oversell", doc: "nor anything that links a Kubernetes client: it uses api/v1alpha1, webhooks/serving and webhooks/jsonscan only",
		deny: []forbidden{sidecar, internal, ours}, allow: []string{mod + "/api/v1alpha1", mod + "/webhooks/serving", mod + "/webhooks/jsonscan"}},
	{pkg: "webhooks/serving", doc: "it must not import controller-runtime, client-go or any other hookwright package", deny: []forbidden{ours}},
	{pkg: "webhooks/jsonscan", doc: "The package imports only the standard library", stdOnly: true},
	{pkg: "internal/desired", doc: "It must not import a Kubernetes client (controller-runtime's client, client-go's clientsets) nor anything that does", deny: []forbidden{servers}},
	{pkg: "internal/health", doc: "this package must not import a client, controllers or the webhook servers", deny: []forbidden{servers}},
	{pkg: "internal/certificates/pki", doc: "It must not import any other hookwright package, nor a Kubernetes client", deny: []forbidden{ours}},
	{pkg: "internal/certificates/csrsign", doc: "It must not import a Kubernetes client, the operator or the webhook servers", deny: []forbidden{servers}},
	{pkg: "internal/certificates/csrplan", doc: "It must not import a Kubernetes client, the operator or the webhook servers", deny: []forbidden{servers}},
	{pkg: "internal/requeue", doc: "It is pure and imports only the standard library", stdOnly: true},
	{pkg: "internal/monitoring", doc: "imports only the standard library and sigs.k8s.io/yaml", deny: []forbidden{ours}},
	{pkg: "internal/serverpolicy", doc: "It must not import any hookwright package but api/v1alpha1, nor a Kubernetes client: it is a pure decision",
		deny: []forbidden{ours}, allow: []string{mod + "/api/v1alpha1"}},
	{pkg: "internal/webhookprobe", doc: "It must not import a Kubernetes client: every function is a function of its inputs", deny: []forbidden{servers}},
	{pkg: "internal/certificates/cadir", doc: "It must not import any other hookwright package, nor a Kubernetes client", deny: []forbidden{ours}},
	{pkg: "internal/certificates", doc: "It imports nothing", stdOnly: true},
	{pkg: "internal/version", doc: "It imports nothing", stdOnly: true},
	{pkg: "internal/failopen", doc: "It must not import a Kubernetes client, the operator or the webhook servers", deny: []forbidden{ours}},
	{pkg: "internal/healthcheck", doc: "It must not import a Kubernetes client, the operator or the webhook servers",
		deny: []forbidden{ours}, allow: []string{mod + "/api/v1alpha1"}},
	{pkg: "internal/fleet", doc: "It must not import a Kubernetes client (controller-runtime's client or cache, client-go's clientsets), the operator or the oversell engine",
		deny: []forbidden{oversell, servers}, allow: []string{mod + "/webhooks/sidecar", mod + "/webhooks/serving", mod + "/webhooks/jsonscan"}},
	{pkg: "internal/helmchart", doc: "It must not import a Kubernetes client, the operator or the webhook servers", deny: []forbidden{servers}},
	{pkg: "hack/doclinks", doc: "It has no code of its own and imports only the standard library", stdOnly: true},
	{pkg: "internal/rollout", doc: "It must not import the operator, the oversell engine, image tooling or the test harness", shell: true,
		deny: []forbidden{oversell, servers}, allow: []string{mod + "/webhooks/sidecar", mod + "/webhooks/serving", mod + "/webhooks/jsonscan"}},
	{pkg: "cmd/app/validation", doc: "It must not import controllers: it compiles CRs with the servers' own code", shell: true},
	{pkg: "internal/podindex", doc: "It is pure: no Kubernetes client, no operator, no webhook server but the sidecar engine (through internal/fleet) and the oversell engine's units (through internal/usageratio)",
		deny: []forbidden{servers}, allow: []string{mod + "/webhooks/sidecar", mod + "/webhooks/serving", mod + "/webhooks/jsonscan", mod + "/webhooks/oversell"}},
}

// pkgInfo is what go list tells about one package.
type pkgInfo struct {
	ImportPath string
	Dir        string
	Imports    []string
	Standard   bool
}

// graph is the import graph of the listed packages' closures.
type graph map[string]pkgInfo

func loadGraph(t *testing.T, pkgs []string) graph {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	cmd := exec.Command(goTool, append([]string{"list", "-deps", "-json=ImportPath,Dir,Imports,Standard"}, pkgs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkgInfo
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		g[p.ImportPath] = p
	}
	return g
}

// chains returns, in breadth-first order, every package in root's closure
// (root excluded) with the shortest import chain from root to it.
func (g graph) chains(root string) ([]string, map[string][]string) {
	parent := map[string]string{root: ""}
	queue := []string{root}
	var order []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		imports := slices.Clone(g[p].Imports)
		slices.Sort(imports)
		for _, q := range imports {
			if _, seen := parent[q]; seen {
				continue
			}
			parent[q] = p
			order = append(order, q)
			queue = append(queue, q)
		}
	}
	chain := map[string][]string{}
	for _, q := range order {
		var c []string
		for p := q; p != ""; p = parent[p] {
			c = append(c, p)
		}
		slices.Reverse(c)
		chain[q] = c
	}
	return order, chain
}

func under(path, prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }

// violations checks r against g: one message per kind of forbidden
// dependency found, naming the nearest such package, its import chain and
// how many more of that kind the closure holds.
func (g graph) violations(r rule) []string {
	root := mod + "/" + r.pkg
	order, chain := g.chains(root)
	base := []forbidden{clients, operator, images, harness}
	if r.shell {
		base = base[1:]
	}
	var out []string
	report := func(what string, hits []string) {
		if len(hits) == 0 {
			return
		}
		more := ""
		if len(hits) > 1 {
			more = fmt.Sprintf(" (and %d more such packages)", len(hits)-1)
		}
		out = append(out, fmt.Sprintf("%s depends on %s, %s%s, through\n\t%s\nits package doc: %q",
			r.pkg, what, hits[0], more, strings.Join(short(chain[hits[0]]), "\n\t-> "), r.doc))
	}
	for _, f := range append(base, r.deny...) {
		var hits []string
		for _, q := range order {
			if slices.Contains(r.allow, q) {
				continue
			}
			for _, p := range f.paths {
				if under(q, p) && !under(q, root) {
					hits = append(hits, q)
					break
				}
			}
		}
		report(f.what, hits)
	}
	if r.stdOnly {
		var hits []string
		for _, q := range order {
			if !g[q].Standard {
				hits = append(hits, q)
			}
		}
		report("a package outside the standard library", hits)
	}
	return out
}

// packageDoc is the package comment of the non-test files in dir, with
// its lines joined by single spaces.
func packageDoc(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc != nil {
			docs = append(docs, af.Doc.Text())
		}
	}
	return strings.Join(strings.Fields(strings.Join(docs, " ")), " ")
}

// short writes this module's packages relative to it.
func short(chain []string) []string {
	out := make([]string, len(chain))
	for i, p := range chain {
		out[i] = strings.TrimPrefix(p, mod+"/")
	}
	return out
}

// TestPurePackagesClosure checks every rule in pure against what the
// packages link today.
func TestPurePackagesClosure(t *testing.T) {
	var pkgs []string
	for _, r := range pure {
		pkgs = append(pkgs, mod+"/"+r.pkg)
	}
	g := loadGraph(t, pkgs)
	for _, r := range pure {
		p, ok := g[mod+"/"+r.pkg]
		if !ok {
			t.Errorf("%s: not listed by go list", r.pkg)
			continue
		}
		// The rule checked is the one the package states.
		if doc := packageDoc(t, p.Dir); !strings.Contains(doc, r.doc) {
			t.Errorf("%s: its package doc no longer says %q: update the rule with the doc", r.pkg, r.doc)
		}
		for _, v := range g.violations(r) {
			t.Error(v)
		}
	}
}

// The checker itself: a forbidden package two imports away is found, with
// its chain, and an allowed one is not.
func TestViolationsNameTheChain(t *testing.T) {
	g := graph{
		mod + "/internal/desired":                  {Imports: []string{mod + "/api/v1alpha1", mod + "/webhooks/sidecar", "fmt"}},
		mod + "/api/v1alpha1":                      {Imports: []string{"fmt"}},
		mod + "/webhooks/sidecar":                  {Imports: []string{"sigs.k8s.io/controller-runtime/pkg/cache"}},
		"sigs.k8s.io/controller-runtime/pkg/cache": {Imports: []string{"k8s.io/client-go/rest"}},
		"k8s.io/client-go/rest":                    {},
		"fmt":                                      {Standard: true},
	}
	got := g.violations(rule{pkg: "internal/desired", doc: "no client", deny: []forbidden{servers}})
	want := []string{
		"internal/desired depends on a Kubernetes client, sigs.k8s.io/controller-runtime/pkg/cache (and 1 more such packages), through\n\tinternal/desired\n\t-> webhooks/sidecar\n\t-> sigs.k8s.io/controller-runtime/pkg/cache\nits package doc: \"no client\"",
		"internal/desired depends on a webhook server, github.com/hookwright/hookwright/webhooks/sidecar, through\n\tinternal/desired\n\t-> webhooks/sidecar\nits package doc: \"no client\"",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if v := g.violations(rule{pkg: "api/v1alpha1", deny: []forbidden{ours}}); len(v) != 0 {
		t.Errorf("api/v1alpha1: %v", v)
	}
	if v := g.violations(rule{pkg: "internal/desired", stdOnly: true}); len(v) != 2 {
		t.Errorf("stdOnly: %v", v)
	}
	// A shell may link a client, nothing else of the base rule.
	if v := g.violations(rule{pkg: "internal/desired", shell: true, allow: []string{mod + "/webhooks/sidecar"}}); len(v) != 0 {
		t.Errorf("shell with a client: %v", v)
	}
	g[mod+"/webhooks/sidecar"] = pkgInfo{Imports: []string{mod + "/controllers"}}
	if v := g.violations(rule{pkg: "internal/desired", shell: true, allow: []string{mod + "/webhooks/sidecar"}}); len(v) != 1 || !strings.Contains(v[0], "the operator") {
		t.Errorf("shell importing the operator: %v", v)
	}
}
