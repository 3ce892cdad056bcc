package cluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// HookwrightBinary builds ./cmd once per process (go build's cache makes
// later builds cheap) and returns the binary's path. RemoveHookwrightBinary
// deletes it; call it from TestMain after the tests.
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
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd: %v\n%s", err, out)
		}
	})
	return binPath, buildErr
}

// RemoveHookwrightBinary deletes what HookwrightBinary built, if anything.
func RemoveHookwrightBinary() {
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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

// MustFreePort is FreePort for tests: it fails t on error.
func MustFreePort(t testing.TB) int {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
