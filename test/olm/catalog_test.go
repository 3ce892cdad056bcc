package olm

import (
	"reflect"
	"testing"
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
