package cluster

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// LoadSample decodes config/samples/<file> strictly into obj, so tests use
// the very samples users apply.
func LoadSample(file string, obj any) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "samples", file))
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, obj); err != nil {
		return fmt.Errorf("sample %s: %w", file, err)
	}
	return nil
}
