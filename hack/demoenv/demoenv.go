// Package demoenv is the shell file `make demo` writes for a user's shell
// (`. _demo/env`) and that the run-bundle targets read their defaults from
// (hack/runbundle): the demo's kubeconfig, the trust store holding its
// registry's CA and the registry's HTTPS address.
//
// It is pure: no client, no cluster. It is demo tooling (hack/runbundle
// and test/e2e use it); the operator never imports it.
package demoenv

import (
	"bufio"
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// FileName is the file's name in the demo's directory.
const FileName = "env"

// The variables the file sets and hack/runbundle reads.
const (
	Kubeconfig    = "KUBECONFIG"
	SSLCertFile   = "SSL_CERT_FILE"
	ImageRegistry = "IMAGE_REGISTRY"
)

// Render returns the file: a comment, then `export NAME='value'` for each
// of vars (sorted by name), then pathDirs put in front of PATH when given.
// Values must not hold a single quote or a newline.
func Render(vars map[string]string, pathDirs ...string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# make demo's cluster and registry, for a shell: . _demo/env\n")
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := vars[k]
		if strings.ContainsAny(v, "'\n") {
			return nil, fmt.Errorf("demoenv: %s=%q: a value may not hold a quote or a newline", k, v)
		}
		fmt.Fprintf(&b, "export %s='%s'\n", k, v)
	}
	if len(pathDirs) > 0 {
		p := strings.Join(pathDirs, ":")
		if strings.ContainsAny(p, "'\n") {
			return nil, fmt.Errorf("demoenv: PATH dirs %q: may not hold a quote or a newline", p)
		}
		fmt.Fprintf(&b, "export PATH='%s':\"$PATH\"\n", p)
	}
	return b.Bytes(), nil
}

// Parse reads the `export NAME='value'` lines of a file Render wrote and
// returns them by name; PATH, comments and blank lines are skipped. Any
// other line is an error naming it.
func Parse(data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "export PATH=") {
			continue
		}
		rest, ok := strings.CutPrefix(line, "export ")
		k, v, ok2 := strings.Cut(rest, "=")
		if !ok || !ok2 || len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' || strings.Contains(v[1:len(v)-1], "'") {
			return nil, fmt.Errorf("demoenv: line %d %q: want export NAME='value'", n, line)
		}
		out[k] = v[1 : len(v)-1]
	}
	return out, sc.Err()
}
