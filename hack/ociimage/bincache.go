package ociimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// BuildCacheEnv names the directory OperatorBinary keeps linked operator
// binaries in; "off" turns the cache off. Unset, it is hookwright/bin under
// the user's cache directory (os.UserCacheDir: $XDG_CACHE_HOME or
// ~/.cache).
const BuildCacheEnv = "HOOKWRIGHT_BUILD_CACHE"

// binCacheMaxAge is how long a cached binary that nobody asked for is
// kept: long enough for a day of runs on one commit, short enough that
// old commits do not pile up (each binary is about 100 MB).
const binCacheMaxAge = 48 * time.Hour

// OperatorBinary writes to out the static linux/arch operator binary
// hack/build.sh links for version and commit. go build caches compiled
// packages but never a linked executable, and linking this one costs about
// 15 CPU-seconds and 1.5 GB of memory: a make test that builds the image
// and the binary in a dozen places spent minutes of CPU linking the same
// bytes. So the binary is kept in a cache keyed by what decides its bytes:
// the build ID of every package it links (go list -export, which compiles
// with build.sh's flags and so hits go build's cache), build.sh itself,
// version, commit and arch. Concurrent callers compute the key one at a
// time and, with the same key, wait on a file lock, so one of them links. Any error of the cache falls back to
// running build.sh into out.
func OperatorBinary(ctx context.Context, root, arch, version, commit, out string) error {
	dir, ok := binCacheDir()
	if !ok {
		return buildOperator(ctx, root, arch, version, commit, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return buildOperator(ctx, root, arch, version, commit, out)
	}
	key, err := lockedOperatorKey(ctx, dir, root, arch, version, commit)
	if err != nil {
		return buildOperator(ctx, root, arch, version, commit, out)
	}
	unlock, err := lockFile(filepath.Join(dir, key+".lock"))
	if err != nil {
		return buildOperator(ctx, root, arch, version, commit, out)
	}
	defer unlock()
	cached := filepath.Join(dir, key)
	if _, err := os.Stat(cached); err != nil {
		tmp := fmt.Sprintf("%s.tmp-%d", cached, os.Getpid())
		if err := buildOperator(ctx, root, arch, version, commit, tmp); err != nil {
			_ = os.Remove(tmp)
			return err
		}
		if err := os.Rename(tmp, cached); err != nil {
			_ = os.Remove(tmp)
			return buildOperator(ctx, root, arch, version, commit, out)
		}
		pruneBinCache(dir, key)
	}
	now := time.Now()
	_ = os.Chtimes(cached, now, now)
	if err := copyExecutable(cached, out); err != nil {
		return buildOperator(ctx, root, arch, version, commit, out)
	}
	return nil
}

// buildOperator links the operator binary into out; a variable so that
// the cache's tests count links without making them.
var buildOperator = func(ctx context.Context, root, arch, version, commit, out string) error {
	return run(ctx, root, []string{"GOOS=linux", "GOARCH=" + arch},
		filepath.Join(root, "hack", "build.sh"), out, version, commit)
}

func binCacheDir() (string, bool) {
	switch v := os.Getenv(BuildCacheEnv); v {
	case "off":
		return "", false
	case "":
		d, err := os.UserCacheDir()
		if err != nil {
			return "", false
		}
		return filepath.Join(d, "hookwright", "bin"), true
	default:
		return v, true
	}
}

// lockedOperatorKey is operatorKey, one caller at a time while go
// build's cache may be cold. With the cache cold (a fresh machine's first
// make test), go list -export compiles the whole tree below ./cmd (with
// cgo off, as make test's go vet and go test do since 04a8bb4; before,
// nothing else compiled that configuration); the test packages
// start at once and each called it, so eight of them compiled the same
// packages side by side, in step, none reaching go build's cache before
// the others (on a fresh 2-core machine, eight of them ran 26 to 29
// minutes each). Under go-list.lock the first compiles and the others find
// every package cached. A marker (go-list.warm: the Go version, GOCACHE
// and go.sum it was warmed for, touched by each caller) lets the callers
// of a warm cache run at once, as they did before, for a day.
func lockedOperatorKey(ctx context.Context, dir, root, arch, version, commit string) (string, error) {
	marker := filepath.Join(dir, "go-list.warm")
	want, err := warmID(ctx, root)
	if err != nil {
		return "", err
	}
	list := func() (string, error) {
		key, err := operatorKey(ctx, root, arch, version, commit)
		if err == nil {
			markWarm(marker, want)
		}
		return key, err
	}
	if isWarm(marker, want) {
		return list()
	}
	unlock, err := lockFile(filepath.Join(dir, "go-list.lock"))
	if err != nil {
		return "", err
	}
	if isWarm(marker, want) {
		// Warmed while this caller waited: the rest may run at once.
		unlock()
		return list()
	}
	defer unlock()
	return list()
}

// warmMaxAge is how long a go-list.warm marker vouches for go build's
// cache; go build trims entries unused for 5 days.
const warmMaxAge = 24 * time.Hour

// warmID names the cache a marker vouches for: the Go version, GOCACHE
// and this module's go.sum.
func warmID(ctx context.Context, root string) ([]byte, error) {
	env, err := exec.CommandContext(ctx, "go", "env", "GOVERSION", "GOCACHE").Output()
	if err != nil {
		return nil, err
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(append(env, sum...))
	return []byte(hex.EncodeToString(h[:])), nil
}

func isWarm(marker string, want []byte) bool {
	info, err := os.Stat(marker)
	if err != nil || time.Since(info.ModTime()) > warmMaxAge {
		return false
	}
	got, err := os.ReadFile(marker)
	return err == nil && string(got) == string(want)
}

// markWarm writes the marker (through a temporary file, so a reader never
// sees half of it) after a successful go list.
func markWarm(marker string, want []byte) {
	tmp := fmt.Sprintf("%s.tmp-%d", marker, os.Getpid())
	if os.WriteFile(tmp, want, 0o644) == nil {
		_ = os.Rename(tmp, marker)
	}
}

// operatorKey hashes the build IDs of every package ./cmd links, as
// build.sh compiles them (CGO_ENABLED=0, -trimpath), with build.sh's own
// bytes and the link-time inputs.
func operatorKey(ctx context.Context, root, arch, version, commit string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-trimpath", "-deps", "-export", "-f", "{{.ImportPath}} {{.BuildID}}", "./cmd")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	ids, err := cmd.Output()
	if err != nil {
		return "", err
	}
	script, err := os.ReadFile(filepath.Join(root, "hack", "build.sh"))
	if err != nil {
		return "", err
	}
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, b := range [][]byte{ids, script, goVersion, []byte(arch), []byte(version), []byte(commit)} {
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return "hookwright-linux-" + arch + "-" + hex.EncodeToString(h.Sum(nil))[:32], nil
}

// pruneBinCache removes binaries other than keep that nobody asked for in
// binCacheMaxAge, and their lock files.
func pruneBinCache(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if name == keep || strings.HasSuffix(name, ".lock") {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < binCacheMaxAge {
			continue
		}
		_ = os.Remove(filepath.Join(dir, name))
		_ = os.Remove(filepath.Join(dir, name+".lock"))
	}
}

// copyExecutable copies src to dst (mode 0755) through a temporary file
// in dst's directory, so a reader never sees half a binary.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return err
	}
	if _, err := io.Copy(tmp, in); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
