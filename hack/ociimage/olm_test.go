package ociimage

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The bundle image has what bundle.Dockerfile copies, file for file, and
// its labels.
func TestBundleImageMatchesDockerfile(t *testing.T) {
	img, err := Bundle("amd64", filepath.Join(root, "bundle"))
	if err != nil {
		t.Fatal(err)
	}
	df := parseDockerfile(t, filepath.Join(root, "bundle.Dockerfile"))
	if df.From != "scratch" {
		t.Fatalf("bundle.Dockerfile's base is %q, want scratch", df.From)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(df.Labels, cf.Config.Labels); diff != "" {
		t.Errorf("labels (-bundle.Dockerfile +image):\n%s", diff)
	}
	if cf.Config.User != "" || len(cf.Config.Entrypoint) != 0 || len(cf.Config.Cmd) != 0 {
		t.Errorf("bundle config %+v: bundle.Dockerfile sets no user or command", cf.Config)
	}

	want := map[string][]byte{}
	for _, c := range df.Copies {
		src, dst := filepath.Join(root, c[0]), c[1]
		err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(src, p)
			b, err := os.ReadFile(p)
			want[filepath.Join(dst, rel)] = b
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	got := map[string][]byte{}
	for p, e := range flatten(t, img) {
		if e.hdr.Typeflag == tar.TypeReg {
			got[p] = e.data
		}
	}
	if len(want) < 5 {
		t.Fatalf("bundle.Dockerfile copies only %d files: %v", len(want), df.Copies)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files (-bundle.Dockerfile +image):\n%s", diff)
	}
}

func TestBundleBadInput(t *testing.T) {
	dir := t.TempDir()
	if _, err := Bundle("amd64", dir); err == nil || !strings.Contains(err.Error(), "annotations.yaml") {
		t.Errorf("no metadata: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "metadata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "metadata", "annotations.yaml"), []byte("annotations: [x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Bundle("amd64", dir); err == nil || !strings.Contains(err.Error(), "annotations.yaml") {
		t.Errorf("bad annotations: %v", err)
	}
}

// The OLM images' composition, with a static stand-in for busybox, opm and
// cpb (the pause program): /bin/sh and the other applets resolve to
// busybox, opm and cpb are where the pods' commands call them.
func TestOLMImages(t *testing.T) {
	dir := t.TempDir()
	static, err := goBuild(context.Background(), root, "./test/images/pause", dir, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	opm, err := opmImage("amd64", static, static)
	if err != nil {
		t.Fatal(err)
	}
	util, err := olmUtil("amd64", static, static)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := decompression("amd64", static)
	if err != nil {
		t.Fatal(err)
	}
	index, err := index("amd64", static, static)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, files map[string]entry, want ...string) {
		t.Helper()
		for _, p := range append([]string{"/bin/busybox", "/tmp", "/etc/passwd"}, want...) {
			if _, ok := files[p]; !ok {
				t.Errorf("%s: no %s", name, p)
			}
		}
		for _, a := range []string{"sh", "cat", "gzip", "cp", "mkdir"} {
			if e := files["/bin/"+a]; e.hdr == nil || e.hdr.Typeflag != tar.TypeSymlink || e.hdr.Linkname != "busybox" {
				t.Errorf("%s: /bin/%s is not a link to busybox", name, a)
			}
		}
	}
	check("opm", flatten(t, opm), "/bin/opm")
	check("util", flatten(t, util), "/bin/cpb")
	check("decompression", flatten(t, dec))
	indexFiles := flatten(t, index)
	check("index", indexFiles, "/bin/opm")
	if e := indexFiles["/configs"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir {
		t.Errorf("index: no /configs directory")
	}
	for p := range indexFiles {
		if strings.HasPrefix(p, "/configs/") {
			t.Errorf("index: /configs is not empty: %s", p)
		}
	}
	icf, err := index.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if icf.Config.Labels[indexConfigsLabel] != "/configs" || cmp.Diff([]string{"serve", "/configs", "--cache-dir=/tmp/cache"}, icf.Config.Cmd) != "" {
		t.Errorf("index config %+v", icf.Config)
	}
	cf, err := opm.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cmp.Diff([]string{"/bin/opm"}, cf.Config.Entrypoint) != "" || cf.Config.User != "1001" || !strings.Contains(strings.Join(cf.Config.Env, " "), "/bin") {
		t.Errorf("opm config %+v", cf.Config)
	}

	// These images have no libc: a dynamic program or a script is refused,
	// naming the package that has a static busybox.
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, bb := range []string{script, "/bin/ls", filepath.Join(dir, "missing")} {
		if _, err := decompression("amd64", bb); err == nil || !strings.Contains(err.Error(), "busybox-static") {
			t.Errorf("busybox %s: %v", bb, err)
		}
	}
	if _, err := opmImage("amd64", "/bin/ls", static); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("dynamic opm: %v", err)
	}
}
