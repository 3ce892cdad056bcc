package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/ociimage"
)

// RepoRoot walks up from the working directory to the hookwright go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/hookwright/hookwright\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("hookwright repository root not found above the working directory")
		}
		dir = parent
	}
}

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

// SampleInjector is config/samples' SidecarInjector, named name; it fails
// t if the sample does not decode.
func SampleInjector(t testing.TB, name string) *v1alpha1.SidecarInjector {
	t.Helper()
	si := &v1alpha1.SidecarInjector{}
	if err := LoadSample("admission_v1alpha1_sidecarinjector.yaml", si); err != nil {
		t.Fatal(err)
	}
	si.Name = name
	return si
}

// SetProxyImage sets proxy.image in si's values, as the sample has them:
// the template change a test makes to give a SidecarInjector a new
// revision and its injected pods an outdated one.
func SetProxyImage(si *v1alpha1.SidecarInjector, image string) {
	var v map[string]any
	_ = json.Unmarshal(si.Spec.Values.Raw, &v)
	v["proxy"].(map[string]any)["image"] = image
	b, _ := json.Marshal(v)
	si.Spec.Values = &apiextensionsv1.JSON{Raw: b}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// HookwrightBinary builds ./cmd once per process as hack/build.sh does
// (static, version v0.0.0-dev) and returns the binary's path. The link
// comes from ociimage.OperatorBinary's cache when another package or an
// image build already made it. RemoveHookwrightBinary deletes it; call it
// from TestMain after the tests.
func HookwrightBinary() (string, error) {
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "hw-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "hookwright")
		buildErr = ociimage.OperatorBinary(context.Background(), root, runtime.GOARCH, "v0.0.0-dev", "unknown", binPath)
	})
	return binPath, buildErr
}

// RemoveHookwrightBinary deletes what HookwrightBinary built, if anything.
func RemoveHookwrightBinary() {
	// Waits for a build under way (one started in the background), or
	// stops any from starting.
	buildOnce.Do(func() {})
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
}

// MustHookwrightBinary is HookwrightBinary for tests: it fails t on error.
func MustHookwrightBinary(t testing.TB) string {
	t.Helper()
	bin, err := HookwrightBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
