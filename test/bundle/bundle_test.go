// Package bundle checks the committed OLM bundle (bundle/, bundle.Dockerfile)
// without the operator-sdk binary: it validates it with the same library
// operator-sdk uses (github.com/operator-framework/api/pkg/validation), and
// fails when it is stale against config/ (rebuilt here in-process with the
// kustomize library), so CI catches a forgotten `make bundle`.
//
// It must not import webhooks or internal/ packages: it reads bundle/ and
// config/ as files (controllers only for the names they are built from).
package bundle

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// root is the repository root, relative to this package's directory (where
// go test runs).
const root = "../.."

// regenerate is the command that brings bundle/ up to date.
const regenerate = "run `make bundle` (it builds bin/operator-sdk on first use) and commit bundle/ and bundle.Dockerfile"

// sortedRules orders RBAC rules by their JSON text. A rule list means the
// union of its rules, so order carries nothing, and operator-sdk merges the
// Roles bound to one ServiceAccount in an order of its own.
func sortedRules(t *testing.T, rules []any) []any {
	t.Helper()
	type keyed struct {
		key  string
		rule any
	}
	ks := make([]keyed, 0, len(rules))
	for _, r := range rules {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		ks = append(ks, keyed{string(b), r})
	}
	sort.SliceStable(ks, func(i, j int) bool { return ks[i].key < ks[j].key })
	out := make([]any, len(ks))
	for i, k := range ks {
		out[i] = k.rule
	}
	return out
}

// obj is a Kubernetes object as generic JSON (numbers as float64), so two
// objects compare equal when their YAML means the same.
type obj = map[string]any

func toObj(t *testing.T, what string, y []byte) obj {
	t.Helper()
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	var o obj
	if err := json.Unmarshal(j, &o); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return o
}

// normalize round-trips v through JSON so typed values compare with obj.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// get walks o along keys; nil when a key is missing.
func get(o any, keys ...string) any {
	for _, k := range keys {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[k]
	}
	return o
}

func str(o any, keys ...string) string {
	s, _ := get(o, keys...).(string)
	return s
}

func key(o obj) string {
	return str(o, "kind") + "/" + str(o, "metadata", "name")
}

// kustomizeBuild renders a kustomization the way `kustomize build` does.
func kustomizeBuild(t *testing.T, dir string) []obj {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []obj
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, normalize(t, m).(obj))
	}
	return out
}

// bundleManifests reads every object in bundle/manifests, by file name.
func bundleManifests(t *testing.T) map[string]obj {
	t.Helper()
	dir := filepath.Join(root, "bundle", "manifests")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v: %s", err, regenerate)
	}
	out := map[string]obj{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = toObj(t, e.Name(), b)
	}
	return out
}

func bundleCSV(t *testing.T, ms map[string]obj) obj {
	t.Helper()
	var csv obj
	for name, o := range ms {
		if str(o, "kind") == "ClusterServiceVersion" {
			if csv != nil {
				t.Fatalf("bundle/manifests holds more than one ClusterServiceVersion (%s)", name)
			}
			csv = o
		}
	}
	if csv == nil {
		t.Fatalf("bundle/manifests holds no ClusterServiceVersion: %s", regenerate)
	}
	return csv
}

// prune drops null values and empty maps and lists, recursively: operator-sdk
// writes typed objects, which add zero values (strategy: {}, resources: {},
// creationTimestamp: null) that mean the same as an absent field.
func prune(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			if p := prune(e); p != nil {
				out[k] = p
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	case []any:
		if len(v) == 0 {
			return nil
		}
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = prune(e)
		}
		return out
	}
	return v
}

// stale reports a difference between config/ and bundle/.
func stale(t *testing.T, what string, want, got any) {
	t.Helper()
	if d := cmp.Diff(prune(want), prune(got)); d != "" {
		t.Errorf("bundle/ is stale: %s differs from config/ (-config +bundle):\n%s\n%s", what, d, regenerate)
	}
}

// TestBundleValid runs the validators of `operator-sdk bundle validate
// --select-optional suite=operatorframework` (bundle, CSV and CRD defaults,
// OperatorHub, standard capabilities and categories, good practices,
// deprecated APIs) and fails on any error or warning.
func TestBundleValid(t *testing.T) {
	b, err := manifests.GetBundleFromDir(filepath.Join(root, "bundle"))
	if err != nil {
		t.Fatalf("load bundle: %v", err)
	}
	objs := b.ObjectsToValidate()
	// The Kubernetes version the operator is built and tested against; the
	// deprecated-API checks look for APIs removed by then.
	objs = append(objs, map[string]string{"k8s-version": "1.37"})
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator,
		validation.AlphaDeprecatedAPIsValidator,
		validation.ObjectValidator,
	)
	n := 0
	for _, r := range validators.Validate(objs...) {
		for _, e := range r.Errors {
			t.Errorf("%s: error: %v", r.Name, e)
		}
		for _, w := range r.Warnings {
			t.Errorf("%s: warning: %v", r.Name, w)
		}
		n++
	}
	t.Logf("%d validator results, bundle %s with %d CRDs", n, b.CSV.GetName(), len(b.V1CRDs))
	if b.CSV.Spec.Version.String() == "" {
		t.Error("CSV has no spec.version")
	}
	// A bundle with errors must be caught: make sure the validators do run.
	broken := b.CSV.DeepCopy()
	broken.Spec.InstallModes = nil
	if !hasErrors(validation.ClusterServiceVersionValidator.Validate(broken)) {
		t.Error("the CSV validator accepted a CSV without install modes; it is not running")
	}
}

func hasErrors(rs []errors.ManifestResult) bool {
	for _, r := range rs {
		if r.HasError() {
			return true
		}
	}
	return false
}

// TestBundleDockerfileMatchesAnnotations: the bundle image's labels are the
// bundle's metadata/annotations.yaml, and it copies the three bundle dirs.
func TestBundleDockerfileMatchesAnnotations(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "bundle", "metadata", "annotations.yaml"))
	if err != nil {
		t.Fatalf("%v: %s", err, regenerate)
	}
	var ann struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(b, &ann); err != nil {
		t.Fatal(err)
	}
	df, err := os.ReadFile(filepath.Join(root, "bundle.Dockerfile"))
	if err != nil {
		t.Fatalf("%v: %s", err, regenerate)
	}
	labels := map[string]string{}
	var copies []string
	label := regexp.MustCompile(`^LABEL\s+(\S+?)=(.*)$`)
	for _, line := range strings.Split(string(df), "\n") {
		line = strings.TrimSpace(line)
		if m := label.FindStringSubmatch(line); m != nil {
			labels[m[1]] = strings.Trim(m[2], `"`)
		}
		if strings.HasPrefix(line, "COPY ") {
			copies = append(copies, strings.Join(strings.Fields(line)[1:], " "))
		}
	}
	if len(ann.Annotations) == 0 {
		t.Fatal("bundle/metadata/annotations.yaml has no annotations")
	}
	for k, v := range ann.Annotations {
		if labels[k] != v {
			t.Errorf("bundle.Dockerfile LABEL %s=%q, annotations.yaml says %q: %s", k, labels[k], v, regenerate)
		}
	}
	for k, v := range labels {
		if _, ok := ann.Annotations[k]; !ok && strings.HasPrefix(k, "operators.operatorframework.io.bundle.") {
			t.Errorf("bundle.Dockerfile LABEL %s=%q is not in annotations.yaml: %s", k, v, regenerate)
		}
	}
	wantCopies := []string{
		"bundle/manifests /" + ann.Annotations["operators.operatorframework.io.bundle.manifests.v1"],
		"bundle/metadata /" + ann.Annotations["operators.operatorframework.io.bundle.metadata.v1"],
		"bundle/tests/scorecard /tests/scorecard/",
	}
	sort.Strings(copies)
	stale(t, "bundle.Dockerfile COPY lines", wantCopies, copies)
	for _, k := range []string{"operators.operatorframework.io.bundle.package.v1", "operators.operatorframework.io.bundle.channels.v1", "operators.operatorframework.io.bundle.channel.default.v1"} {
		if ann.Annotations[k] == "" {
			t.Errorf("annotations.yaml lacks %s", k)
		}
	}
}

// TestBundleUpToDate rebuilds config/manifests with the kustomize library and
// checks every piece operator-sdk derives from it: CRDs, the CSV's install
// strategy (Deployment, permissions), its base fields, alm-examples,
// relatedImages, the scorecard config, and that no manifest is left over.
func TestBundleUpToDate(t *testing.T) {
	built := kustomizeBuild(t, "config/manifests")
	ms := bundleManifests(t)
	csv := bundleCSV(t, ms)
	seen := map[string]bool{}
	for name, o := range ms {
		if str(o, "kind") == "ClusterServiceVersion" {
			seen[name] = true
		}
	}
	byKey := map[string]string{}
	for name, o := range ms {
		byKey[key(o)] = name
	}

	var (
		base       obj
		deploys    []obj
		samples    []any
		sa         string
		roles      = map[string]obj{}
		bindings   []obj
		scorecards []obj
	)
	for _, o := range built {
		switch kind := str(o, "kind"); {
		case kind == "ClusterServiceVersion":
			base = o
		case kind == "Deployment":
			deploys = append(deploys, o)
		case kind == "Role" || kind == "ClusterRole":
			roles[key(o)] = o
		case kind == "RoleBinding" || kind == "ClusterRoleBinding":
			bindings = append(bindings, o)
		case kind == "Configuration" && strings.HasPrefix(str(o, "apiVersion"), "scorecard.operatorframework.io/"):
			scorecards = append(scorecards, o)
		case strings.HasSuffix(strings.Split(str(o, "apiVersion"), "/")[0], ".hookwright.io"):
			samples = append(samples, o)
		case kind == "Namespace" || kind == "ServiceAccount":
			// OLM creates the install namespace and the Deployment's
			// ServiceAccount itself.
		default:
			// CRDs and any other object (Service, ServiceMonitor...) are
			// copied into bundle/manifests as they are, without namespace.
			name, ok := byKey[key(o)]
			if !ok {
				t.Errorf("bundle/ is stale: %s from config/manifests is not in bundle/manifests: %s", key(o), regenerate)
				continue
			}
			seen[name] = true
			want, got := o, ms[name]
			delete(get(want, "metadata").(obj), "namespace")
			delete(get(got, "metadata").(obj), "namespace")
			delete(get(got, "metadata").(obj), "creationTimestamp")
			delete(got, "status")
			delete(want, "status")
			stale(t, "bundle/manifests/"+name, want, got)
		}
	}
	// (Cluster)Roles bound to no ServiceAccount of the Deployment (e.g.
	// metrics-reader, for whoever scrapes the metrics) are not permissions
	// of the CSV: operator-sdk copies them into bundle/manifests as they are.
	if len(deploys) == 1 {
		depSA := str(deploys[0], "spec", "template", "spec", "serviceAccountName")
		boundToSA := map[string]bool{}
		for _, b := range bindings {
			for _, s := range get(b, "subjects").([]any) {
				if str(s, "kind") == "ServiceAccount" && str(s, "name") == depSA {
					boundToSA[str(b, "roleRef", "kind")+"/"+str(b, "roleRef", "name")] = true
				}
			}
		}
		for k, want := range roles {
			if boundToSA[k] {
				continue
			}
			name, ok := byKey[k]
			if !ok {
				t.Errorf("bundle/ is stale: %s from config/manifests is not in bundle/manifests: %s", k, regenerate)
				continue
			}
			seen[name] = true
			got := ms[name]
			delete(get(want, "metadata").(obj), "namespace")
			delete(get(got, "metadata").(obj), "creationTimestamp")
			stale(t, "bundle/manifests/"+name, want, got)
		}
	}
	for name := range ms {
		if !seen[name] {
			t.Errorf("bundle/ is stale: bundle/manifests/%s has no source in config/manifests: %s", name, regenerate)
		}
	}
	if base == nil {
		t.Fatal("config/manifests renders no ClusterServiceVersion base")
	}
	if len(deploys) != 1 {
		t.Fatalf("config/manifests renders %d Deployments, want 1", len(deploys))
	}
	dep := deploys[0]
	sa = str(dep, "spec", "template", "spec", "serviceAccountName")

	// Version: the CSV's name and spec.version agree with the Makefile's default.
	version := str(csv, "spec", "version")
	if str(csv, "metadata", "name") != "hookwright.v"+version {
		t.Errorf("CSV name %q does not match spec.version %q", str(csv, "metadata", "name"), version)
	}
	if mk := makefileVersion(t); mk != version {
		t.Errorf("bundle/ is stale: CSV version %s, Makefile VERSION %s: %s", version, mk, regenerate)
	}

	// Install strategy: the Deployment as rendered, and the rules of the
	// (Cluster)Roles bound to its ServiceAccount.
	install := get(csv, "spec", "install", "spec")
	gotDeps, _ := get(install, "deployments").([]any)
	if len(gotDeps) != 1 {
		t.Fatalf("CSV install strategy has %d deployments, want 1: %s", len(gotDeps), regenerate)
	}
	stale(t, "the CSV's Deployment name", str(dep, "metadata", "name"), str(gotDeps[0], "name"))
	stale(t, "the CSV's Deployment spec", get(dep, "spec"), get(gotDeps[0], "spec"))
	stale(t, "the CSV's Deployment labels", get(dep, "metadata", "labels"), get(gotDeps[0], "label"))
	wantPerms := map[string][]any{}
	for _, b := range bindings {
		bound := false
		for _, s := range get(b, "subjects").([]any) {
			if str(s, "kind") == "ServiceAccount" && str(s, "name") == sa {
				bound = true
			}
		}
		if !bound {
			continue
		}
		field := "permissions"
		if str(b, "kind") == "ClusterRoleBinding" {
			field = "clusterPermissions"
		}
		r, ok := roles[str(b, "roleRef", "kind")+"/"+str(b, "roleRef", "name")]
		if !ok {
			t.Errorf("%s binds %s/%s, which config/ does not define", key(b), str(b, "roleRef", "kind"), str(b, "roleRef", "name"))
			continue
		}
		rules, _ := get(r, "rules").([]any)
		wantPerms[field] = append(wantPerms[field], rules...)
	}
	for _, field := range []string{"permissions", "clusterPermissions"} {
		var got []any
		entries, _ := get(install, field).([]any)
		for _, e := range entries {
			if str(e, "serviceAccountName") != sa {
				t.Errorf("CSV %s names ServiceAccount %q, the Deployment runs as %q", field, str(e, "serviceAccountName"), sa)
			}
			rules, _ := get(e, "rules").([]any)
			got = append(got, rules...)
		}
		stale(t, "the CSV's "+field+" (config/rbac)", sortedRules(t, wantPerms[field]), sortedRules(t, got))
	}

	// Base fields: everything in config/manifests/bases except what
	// operator-sdk fills in.
	for _, f := range []string{"displayName", "description", "icon", "keywords", "links", "maintainers", "maturity", "minKubeVersion", "provider", "installModes", "customresourcedefinitions"} {
		stale(t, "the CSV's spec."+f, get(base, "spec", f), get(csv, "spec", f))
	}
	for k, v := range get(base, "metadata", "annotations").(obj) {
		if k == "alm-examples" {
			continue
		}
		stale(t, "the CSV's annotation "+k, v, get(csv, "metadata", "annotations", k))
	}
	containers := asList(get(dep, "spec", "template", "spec", "containers"))
	if len(containers) == 0 {
		t.Fatal("the Deployment has no containers")
	}
	stale(t, "the CSV's containerImage annotation (the operator image)", str(containers[0], "image"), str(csv, "metadata", "annotations", "containerImage"))

	// alm-examples: the samples, in any order.
	var examples []any
	if err := json.Unmarshal([]byte(str(csv, "metadata", "annotations", "alm-examples")), &examples); err != nil {
		t.Errorf("CSV alm-examples is not a JSON list: %v", err)
	}
	sortObjs(samples)
	sortObjs(examples)
	stale(t, "alm-examples (config/samples)", samples, examples)

	// relatedImages: the operator image and every RELATED_IMAGE_* value.
	wantImages := map[string]string{}
	for _, c := range containers {
		for _, e := range asList(get(c, "env")) {
			if n := str(e, "name"); strings.HasPrefix(n, "RELATED_IMAGE_") {
				wantImages[str(e, "value")] = strings.ToLower(strings.TrimPrefix(n, "RELATED_IMAGE_"))
			}
		}
	}
	gotImages := map[string]string{}
	for _, ri := range asList(get(csv, "spec", "relatedImages")) {
		gotImages[str(ri, "image")] = str(ri, "name")
	}
	for img, name := range wantImages {
		if gotImages[img] != name {
			t.Errorf("bundle/ is stale: relatedImages lacks {name: %s, image: %s} (env RELATED_IMAGE_%s): %s", name, img, strings.ToUpper(name), regenerate)
		}
	}

	// The scorecard config.
	if len(scorecards) != 1 {
		t.Fatalf("config/manifests renders %d scorecard Configurations, want 1", len(scorecards))
	}
	sc, err := os.ReadFile(filepath.Join(root, "bundle", "tests", "scorecard", "config.yaml"))
	if err != nil {
		t.Fatalf("%v: %s", err, regenerate)
	}
	stale(t, "bundle/tests/scorecard/config.yaml (config/scorecard)", scorecards[0], toObj(t, "scorecard config", sc))
}

// TestBundleIcon: the CSV's icon is config/manifests/icon.svg.
func TestBundleIcon(t *testing.T) {
	svg, err := os.ReadFile(filepath.Join(root, "config", "manifests", "icon.svg"))
	if err != nil {
		t.Fatal(err)
	}
	csv := bundleCSV(t, bundleManifests(t))
	icons := asList(get(csv, "spec", "icon"))
	if len(icons) != 1 {
		t.Fatalf("CSV has %d icons, want 1", len(icons))
	}
	if str(icons[0], "mediatype") != "image/svg+xml" {
		t.Errorf("icon mediatype %q, want image/svg+xml", str(icons[0], "mediatype"))
	}
	if got := str(icons[0], "base64data"); got != base64.StdEncoding.EncodeToString(svg) {
		t.Errorf("the CSV's icon is not config/manifests/icon.svg: update spec.icon in config/manifests/bases (base64 -w0 config/manifests/icon.svg), then %s", regenerate)
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func sortObjs(l []any) {
	sort.Slice(l, func(i, j int) bool { return fmt.Sprint(key(l[i].(obj))) < fmt.Sprint(key(l[j].(obj))) })
}

// makefileVersion is the Makefile's default VERSION (VERSION ?= x.y.z).
func makefileVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION \?= (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Makefile has no `VERSION ?= x.y.z` line")
	}
	return string(m[1])
}

// TestBundleDescriptorsMatchMarkers: every +operator-sdk:csv descriptor
// marker in api/v1alpha1 is in the bundle's CSV (catches a marker added or
// renamed without `make bundle`, which needs operator-sdk to re-read them),
// and every top-level spec field the samples set has a spec descriptor (the
// scorecard's olm-spec-descriptors test, which `make bundle` also runs).
func TestBundleDescriptorsMatchMarkers(t *testing.T) {
	csv := bundleCSV(t, bundleManifests(t))
	have := map[string]bool{} // "<kind>/<spec|status>/<displayName>"
	specPaths := map[string]map[string]bool{}
	for _, o := range asList(get(csv, "spec", "customresourcedefinitions", "owned")) {
		kind := str(o, "kind")
		have[kind+"/type/"+str(o, "displayName")] = true
		specPaths[kind] = map[string]bool{}
		for _, typ := range []string{"spec", "status"} {
			for _, d := range asList(get(o, typ+"Descriptors")) {
				have[kind+"/"+typ+"/"+str(d, "displayName")] = true
				if typ == "spec" {
					specPaths[kind][str(d, "path")] = true
				}
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(root, "api", "v1alpha1", "*_types.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no api/v1alpha1/*_types.go: %v", err)
	}
	marker := regexp.MustCompile(`\+operator-sdk:csv:customresourcedefinitions:(?:type=(spec|status),)?displayName="([^"]+)"`)
	kindOf := regexp.MustCompile(`(?m)^type (\w+) struct`)
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// A field marker belongs to the kind named after its file's root
		// type (sidecarinjector_types.go: SidecarInjector); shared structs
		// (common_types.go) are not top-level descriptors.
		kinds := kindOf.FindAllSubmatch(b, -1)
		var kind string
		for _, k := range kinds {
			if _, ok := specPaths[string(k[1])]; ok {
				kind = string(k[1])
			}
		}
		if kind == "" {
			continue
		}
		for _, m := range marker.FindAllSubmatch(b, -1) {
			typ := string(m[1])
			if typ == "" {
				typ = "type"
			}
			n++
			if !have[kind+"/"+typ+"/"+string(m[2])] {
				t.Errorf("bundle/ is stale: the marker %s %s %q in %s is not in the CSV: %s", kind, typ, m[2], filepath.Base(f), regenerate)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no +operator-sdk:csv markers in api/v1alpha1")
	}
	t.Logf("%d CSV markers checked", n)

	for _, o := range kustomizeBuild(t, "config/samples") {
		kind := str(o, "kind")
		spec, _ := get(o, "spec").(obj)
		for field := range spec {
			if !specPaths[kind][field] {
				t.Errorf("sample %s sets spec.%s, which has no spec descriptor: add a +operator-sdk:csv:customresourcedefinitions:type=spec marker on the field, then %s", key(o), field, regenerate)
			}
		}
	}
}
