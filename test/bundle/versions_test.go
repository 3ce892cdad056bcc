package bundle

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"sigs.k8s.io/yaml"
)

// The CSV's minKubeVersion is the oldest minor make test-compat runs
// (hack/tools.sh K8S_COMPAT, docs/versions.md): a claim, not a guess.
func TestMinKubeVersionIsOldestTested(t *testing.T) {
	sh, err := os.ReadFile(filepath.Join(root, "hack", "tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	decl := regexp.MustCompile(`(?m)^declare -A K8S_COMPAT=\((.*)\)$`).FindSubmatch(sh)
	if decl == nil {
		t.Fatal("hack/tools.sh: no declare -A K8S_COMPAT=(...)")
	}
	var minors []int
	for _, m := range regexp.MustCompile(`\[1\.([0-9]+)\]=`).FindAllSubmatch(decl[1], -1) {
		n, _ := strconv.Atoi(string(m[1]))
		minors = append(minors, n)
	}
	if len(minors) == 0 {
		t.Fatalf("hack/tools.sh: K8S_COMPAT names no minor: %s", decl[0])
	}
	want := "1." + strconv.Itoa(slices.Min(minors)) + ".0"
	for _, f := range []string{"config/manifests/bases/hookwright.clusterserviceversion.yaml", "bundle/manifests/hookwright.clusterserviceversion.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var csv struct {
			Spec struct {
				MinKubeVersion string `json:"minKubeVersion"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &csv); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if csv.Spec.MinKubeVersion != want {
			t.Errorf("%s: minKubeVersion %q, want %q: the oldest minor make test-compat runs (hack/tools.sh K8S_COMPAT)", f, csv.Spec.MinKubeVersion, want)
		}
	}
}
