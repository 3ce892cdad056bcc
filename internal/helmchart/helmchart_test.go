package helmchart

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const root = "../.."

// TestChartCurrent fails when the committed dist/chart differs from what
// config/ generates now: a file changed, missing or left over.
func TestChartCurrent(t *testing.T) {
	want, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	dir := filepath.Join(root, Dir)
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		got[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v (run `make chart` and commit it)", Dir, err)
	}
	var names []string
	for n := range want {
		names = append(names, n)
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if diff := cmp.Diff(string(want[n]), string(got[n])); diff != "" {
			t.Errorf("%s/%s is stale; run `make chart` and commit %s (-generated +committed):\n%s", Dir, n, Dir, diff)
		}
	}
}

// TestGenerateTemplatises checks the fields the values own and the
// objects config/ does not deploy by default.
func TestGenerateTemplatises(t *testing.T) {
	files, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		text := string(b)
		if strings.Contains(text, Namespace) {
			t.Errorf("%s still names namespace %s", name, Namespace)
		}
		if strings.Contains(text, "managed-by: kustomize") {
			t.Errorf("%s keeps kustomize's managed-by label", name)
		}
	}
	for file, wants := range map[string][]string{
		"templates/deployment-controller-manager.yaml": {
			"replicas: {{ .Values.replicas }}",
			`image: {{ include "hookwright.image" . }}`,
			"value: {{ include \"hookwright.image\" . }}",
			"toYaml .Values.resources | nindent 10",
			"priorityClassName: {{ . | quote }}",
		},
		"templates/customresourcedefinition-sidecarinjectors.admission.hookwright.io.yaml": {
			"{{- if .Values.crds.keep }}\n    helm.sh/resource-policy: keep\n{{- end }}",
		},
		"templates/servicemonitor-controller-manager-metrics-monitor.yaml": {"{{- if .Values.monitoring.serviceMonitor.enabled }}"},
		"templates/podmonitor-webhook-servers.yaml":                        {"{{- if .Values.monitoring.podMonitor.enabled }}"},
		"templates/prometheusrule-alerts.yaml": {
			"{{- if .Values.monitoring.prometheusRule.enabled }}",
			// Prometheus's own template text stays literal.
			`{{ "{{" }} $labels.name {{ "}}" }}`,
		},
		// go:embed leaves out files starting with "_" unless told all:.
		"templates/_helpers.tpl":                       {`define "hookwright.chart"`, `define "hookwright.image"`},
		"templates/install-check.yaml":                 {"lookup"},
		"templates/networkpolicy-webhook-servers.yaml": {"{{- if .Values.networkPolicy.enabled }}"},
		"values.yaml":                                  {"repository: ghcr.io/hookwright/hookwright", "replicas: 2", "keep: true"},
	} {
		text, ok := files[file]
		if !ok {
			t.Errorf("no %s", file)
			continue
		}
		for _, w := range wants {
			if !strings.Contains(string(text), w) {
				t.Errorf("%s lacks %q", file, w)
			}
		}
	}
	if _, ok := files["templates/namespace-system.yaml"]; ok {
		t.Error("the chart creates the namespace; it must use the release namespace")
	}
}
