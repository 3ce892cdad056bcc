package olmbundle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Derive: a next version that replaces the source, with the operator
// image replaced wherever the CSV names it; the source is untouched.
func TestDerive(t *testing.T) {
	src := filepath.Join(t.TempDir(), "bundle")
	for path, content := range map[string]string{
		"manifests/pkg.clusterserviceversion.yaml": "apiVersion: operators.coreos.com/v1alpha1\nkind: ClusterServiceVersion\nmetadata:\n  name: pkg.v0.1.0\n  annotations:\n    containerImage: op:v0.1.0\nspec:\n  version: 0.1.0\n  install:\n    spec:\n      deployments:\n      - spec:\n          template:\n            spec:\n              containers:\n              - image: op:v0.1.0\n                env:\n                - {name: RELATED_IMAGE_SERVER, value: op:v0.1.0}\n                - {name: OTHER, value: op:v0.1.0-not}\n",
		"manifests/crd.yaml":                       "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: xs.example.com\n",
		"metadata/annotations.yaml":                "annotations:\n  operators.operatorframework.io.bundle.package.v1: pkg\n",
	} {
		p := filepath.Join(src, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dst := filepath.Join(t.TempDir(), "next")
	r, err := Derive(src, dst, Options{Version: "0.1.1", Image: "op:v0.1.1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.OldName != "pkg.v0.1.0" || r.NewName != "pkg.v0.1.1" || r.OldImage != "op:v0.1.0" {
		t.Errorf("result %+v", r)
	}
	raw, err := os.ReadFile(filepath.Join(dst, "manifests/pkg.clusterserviceversion.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var csv struct {
		Metadata struct{ Name string }
		Spec     struct{ Version, Replaces string }
	}
	if err := yaml.Unmarshal(raw, &csv); err != nil {
		t.Fatal(err)
	}
	if csv.Metadata.Name != "pkg.v0.1.1" || csv.Spec.Version != "0.1.1" || csv.Spec.Replaces != "pkg.v0.1.0" {
		t.Errorf("new CSV %+v", csv)
	}
	if n := strings.Count(string(raw), "op:v0.1.1"); n != 3 || !strings.Contains(string(raw), "op:v0.1.0-not") {
		t.Errorf("image replaced %d times, want 3 (annotation, container, RELATED_IMAGE_SERVER):\n%s", n, raw)
	}
	// The same version with the image kept is a copy.
	same := filepath.Join(t.TempDir(), "same")
	if r, err := Derive(src, same, Options{Version: "0.1.0"}); err != nil || r.NewName != r.OldName {
		t.Errorf("Derive same version: %+v %v", r, err)
	}
	for _, f := range []string{"manifests/crd.yaml", "metadata/annotations.yaml"} {
		a, _ := os.ReadFile(filepath.Join(src, f))
		b, err := os.ReadFile(filepath.Join(dst, f))
		if err != nil || string(a) != string(b) {
			t.Errorf("%s not copied as is (%v)", f, err)
		}
	}
	if _, err := Derive(src, dst, Options{Version: "0.1.2"}); err == nil {
		t.Error("overwrote an existing directory")
	}
}
