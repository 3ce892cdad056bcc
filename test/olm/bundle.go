package olm

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// NewBundleVersion copies the bundle directory src to dst (which must not
// exist) as version version of the same package: the ClusterServiceVersion
// is renamed <base>.v<version> (base is the old name up to its last ".v"),
// gets spec.version version and spec.replaces the old name. Everything else
// (CRDs, metadata) is copied as is. It returns the old and new CSV names.
func NewBundleVersion(src, dst, version string) (oldName, newName string, err error) {
	if _, err := os.Stat(dst); err == nil {
		return "", "", fmt.Errorf("new bundle version: %s exists", dst)
	}
	if err := copyTree(src, dst); err != nil {
		return "", "", err
	}
	path, csv, err := findCSV(filepath.Join(dst, "manifests"))
	if err != nil {
		return "", "", err
	}
	meta, _ := csv["metadata"].(map[string]any)
	spec, _ := csv["spec"].(map[string]any)
	if meta == nil || spec == nil {
		return "", "", fmt.Errorf("%s: CSV without metadata or spec", path)
	}
	oldName, _ = meta["name"].(string)
	i := strings.LastIndex(oldName, ".v")
	if i <= 0 {
		return "", "", fmt.Errorf("%s: CSV name %q is not <package>.v<version>", path, oldName)
	}
	newName = oldName[:i] + ".v" + version
	meta["name"] = newName
	spec["version"] = version
	spec["replaces"] = oldName
	out, err := yaml.Marshal(csv)
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return "", "", err
	}
	return oldName, newName, nil
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
