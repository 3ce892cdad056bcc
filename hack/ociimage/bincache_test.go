package ociimage

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The cache links once per key however many callers ask at once, keys on
// the version, prunes what nobody asked for in binCacheMaxAge, and is off
// when HOOKWRIGHT_BUILD_CACHE=off.
func TestOperatorBinaryCache(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	t.Setenv(BuildCacheEnv, cache)
	var links atomic.Int32
	real := buildOperator
	t.Cleanup(func() { buildOperator = real })
	buildOperator = func(_ context.Context, _, arch, version, commit, out string) error {
		links.Add(1)
		time.Sleep(50 * time.Millisecond) // so the callers below overlap
		return os.WriteFile(out, []byte(arch+" "+version+" "+commit), 0o755)
	}
	old := filepath.Join(cache, "hookwright-linux-amd64-old")
	if err := os.WriteFile(old, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := time.Now().Add(-binCacheMaxAge - time.Hour)
	if err := os.Chtimes(old, stale, stale); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	out := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = OperatorBinary(ctx, root, runtime.GOARCH, "v1", "c", filepath.Join(out, "bin"+string(rune('0'+i))))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
		b, err := os.ReadFile(filepath.Join(out, "bin"+string(rune('0'+i))))
		if err != nil || string(b) != runtime.GOARCH+" v1 c" {
			t.Errorf("caller %d got %q, %v", i, b, err)
		}
	}
	if n := links.Load(); n != 1 {
		t.Errorf("4 callers of one key linked %d times, want 1", n)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("a binary unused for %s was kept: %v", binCacheMaxAge+time.Hour, err)
	}
	if err := OperatorBinary(ctx, root, runtime.GOARCH, "v2", "c", filepath.Join(out, "v2")); err != nil {
		t.Fatal(err)
	}
	if n := links.Load(); n != 2 {
		t.Errorf("another version linked %d times in all, want 2", n)
	}
	t.Setenv(BuildCacheEnv, "off")
	if err := OperatorBinary(ctx, root, runtime.GOARCH, "v1", "c", filepath.Join(out, "off")); err != nil {
		t.Fatal(err)
	}
	if n := links.Load(); n != 3 {
		t.Errorf("with the cache off, %d links in all, want 3", n)
	}
}

// The go-list.warm marker vouches only for the cache it names, for a day.
func TestWarmMarker(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "go-list.warm")
	want := []byte("id-1")
	if isWarm(marker, want) {
		t.Fatal("no marker yet, but warm")
	}
	markWarm(marker, want)
	if !isWarm(marker, want) {
		t.Fatal("marked, but not warm")
	}
	if isWarm(marker, []byte("id-2")) {
		t.Fatal("warm for another Go version, GOCACHE or go.sum")
	}
	old := time.Now().Add(-warmMaxAge - time.Minute)
	if err := os.Chtimes(marker, old, old); err != nil {
		t.Fatal(err)
	}
	if isWarm(marker, want) {
		t.Fatal("a marker older than warmMaxAge still warm")
	}
}
