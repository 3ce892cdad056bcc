// Package olmbundle derives bundles from the repository's bundle/ without
// touching it: a next version that replaces it (an OLM upgrade), or the
// same bundle naming another operator image, written to a new directory.
//
// It is pure file work: no client, no image tooling. It is dev tooling
// (hack/runbundle and test/olm use it); the operator never imports it.
package olmbundle

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// Options say what Derive changes.
type Options struct {
	// Version is the new bundle's version (semver without "v"); empty or
	// the source's version keeps the CSV's name and version.
	Version string
	// Image replaces the operator image the CSV names (its containerImage
	// annotation) wherever the CSV names it (the Deployment, RELATED_IMAGE
	// variables, relatedImages); empty keeps it.
	Image string
}

// Result is what Derive wrote.
type Result struct {
	// OldName and NewName are the source's and the new CSV's names (equal
	// when the version is kept).
	OldName, NewName string
	// OldImage is the operator image the source CSV names.
	OldImage string
}

// Derive copies the bundle directory src to dst (which must not exist)
// and edits its ClusterServiceVersion: with a new o.Version it is renamed
// <base>.v<version> (base is the old name up to its last ".v") and gets
// spec.version o.Version and spec.replaces the old name; with o.Image
// every string equal to the old operator image becomes o.Image.
// Everything else (CRDs, metadata) is copied as is.
func Derive(src, dst string, o Options) (Result, error) {
	var r Result
	if _, err := os.Stat(dst); err == nil {
		return r, fmt.Errorf("olmbundle: %s exists", dst)
	}
	if err := copyTree(src, dst); err != nil {
		return r, err
	}
	path, csv, err := findCSV(filepath.Join(dst, "manifests"))
	if err != nil {
		return r, err
	}
	meta, _ := csv["metadata"].(map[string]any)
	spec, _ := csv["spec"].(map[string]any)
	if meta == nil || spec == nil {
		return r, fmt.Errorf("%s: CSV without metadata or spec", path)
	}
	r.OldName, _ = meta["name"].(string)
	r.NewName = r.OldName
	annotations, _ := meta["annotations"].(map[string]any)
	r.OldImage, _ = annotations["containerImage"].(string)
	if v, _ := spec["version"].(string); o.Version != "" && o.Version != v {
		i := strings.LastIndex(r.OldName, ".v")
		if i <= 0 {
			return r, fmt.Errorf("%s: CSV name %q is not <package>.v<version>", path, r.OldName)
		}
		r.NewName = r.OldName[:i] + ".v" + o.Version
		meta["name"] = r.NewName
		spec["version"] = o.Version
		spec["replaces"] = r.OldName
	}
	if o.Image != "" && o.Image != r.OldImage {
		if r.OldImage == "" {
			return r, fmt.Errorf("%s: CSV has no containerImage annotation naming its operator image", path)
		}
		replaceStrings(csv, r.OldImage, o.Image)
	}
	out, err := yaml.Marshal(csv)
	if err != nil {
		return r, err
	}
	return r, os.WriteFile(path, out, 0o644)
}

// replaceStrings replaces, in place, every string value equal to old in v
// (maps and slices of a decoded YAML document) by new.
func replaceStrings(v any, old, new string) any {
	switch x := v.(type) {
	case string:
		if x == old {
			return new
		}
	case map[string]any:
		for k, e := range x {
			x[k] = replaceStrings(e, old, new)
		}
	case []any:
		for i, e := range x {
			x[i] = replaceStrings(e, old, new)
		}
	}
	return v
}

// findCSV returns the path and content of the one ClusterServiceVersion
// manifest in dir.
func findCSV(dir string) (string, map[string]any, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", nil, err
	}
	var path string
	var csv map[string]any
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		raw, err := os.ReadFile(p)
		if err != nil {
			return "", nil, err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			return "", nil, fmt.Errorf("%s: %w", p, err)
		}
		if obj["kind"] != "ClusterServiceVersion" {
			continue
		}
		if csv != nil {
			return "", nil, fmt.Errorf("%s: two ClusterServiceVersions (%s, %s)", dir, path, p)
		}
		path, csv = p, obj
	}
	if csv == nil {
		return "", nil, fmt.Errorf("%s: no ClusterServiceVersion", dir)
	}
	return path, csv, nil
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, raw, 0o644)
	})
}
