package olm

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

func testBundle(name string) *Bundle {
	return &Bundle{Name: name, Package: "pkg", DefaultChannel: "alpha",
		Object: map[string]any{"schema": SchemaBundle, "name": name, "package": "pkg", "image": ""}}
}

func TestBuildCatalogChainsReplaces(t *testing.T) {
	objs, err := BuildCatalog("", testBundle("pkg.v0.1.0"), testBundle("pkg.v0.1.1"), testBundle("pkg.v0.2.0"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 5 {
		t.Fatalf("got %d objects, want package + channel + 3 bundles", len(objs))
	}
	if objs[0]["schema"] != SchemaPackage || objs[0]["defaultChannel"] != "alpha" {
		t.Errorf("package object %v", objs[0])
	}
	want := []any{
		map[string]any{"name": "pkg.v0.1.0"},
		map[string]any{"name": "pkg.v0.1.1", "replaces": "pkg.v0.1.0"},
		map[string]any{"name": "pkg.v0.2.0", "replaces": "pkg.v0.1.1"},
	}
	if objs[1]["schema"] != SchemaChannel || objs[1]["name"] != "alpha" || !reflect.DeepEqual(objs[1]["entries"], want) {
		t.Errorf("channel object %v", objs[1])
	}
}

func TestBuildCatalogRejects(t *testing.T) {
	other := testBundle("other.v1.0.0")
	other.Package = "other"
	for name, bundles := range map[string][]*Bundle{
		"none":           nil,
		"two packages":   {testBundle("pkg.v0.1.0"), other},
		"same CSV twice": {testBundle("pkg.v0.1.0"), testBundle("pkg.v0.1.0")},
	} {
		if _, err := BuildCatalog("alpha", bundles...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestNewBundleVersion(t *testing.T) {
	src := filepath.Join(t.TempDir(), "bundle")
	for path, content := range map[string]string{
		"manifests/pkg.clusterserviceversion.yaml": "apiVersion: operators.coreos.com/v1alpha1\nkind: ClusterServiceVersion\nmetadata:\n  name: pkg.v0.1.0\nspec:\n  version: 0.1.0\n",
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
	oldName, newName, err := NewBundleVersion(src, dst, "0.1.1")
	if err != nil {
		t.Fatal(err)
	}
	if oldName != "pkg.v0.1.0" || newName != "pkg.v0.1.1" {
		t.Errorf("names %q -> %q", oldName, newName)
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
	for _, f := range []string{"manifests/crd.yaml", "metadata/annotations.yaml"} {
		a, _ := os.ReadFile(filepath.Join(src, f))
		b, err := os.ReadFile(filepath.Join(dst, f))
		if err != nil || string(a) != string(b) {
			t.Errorf("%s not copied as is (%v)", f, err)
		}
	}
	if _, _, err := NewBundleVersion(src, dst, "0.1.2"); err == nil {
		t.Error("overwrote an existing directory")
	}
}
