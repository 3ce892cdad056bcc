package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

func TestRunBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"push"}, `unknown command "push"`},
		{[]string{"build", "pause"}, "give --layout, --archive or --push"},
		{[]string{"build", "--layout", t.TempDir(), "nosuchset"}, `unknown image set "nosuchset"`},
		{[]string{"build", "--push", "192.0.2.1:5000", "--bogus"}, "flag provided but not defined"},
	} {
		err := run(context.Background(), tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// `imagectl build --layout` (what make image runs) writes a layout with
// the set's images.
func TestBuildLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oci")
	if err := run(context.Background(), []string{"build", "--root", "../..", "--layout", dir, "pause"}); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["io.containerd.image.name"] != "registry.k8s.io/pause:3.10.2" {
		t.Errorf("layout index %+v", im.Manifests)
	}
}
