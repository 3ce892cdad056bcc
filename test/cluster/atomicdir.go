package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// WriteAtomicDir replaces the files of dir the way the kubelet updates a
// Secret or ConfigMap volume (pkg/volume/util/atomic_writer.go): the payload
// goes into a new hidden "..<timestamp>" directory, a "..data_tmp" symlink to
// it is renamed over "..data" (one atomic step), and every visible name is a
// symlink through "..data". Names no longer in payload are removed, then the
// previous timestamped directory. A watcher of the directory sees the
// "..data" rename; a watcher of a file path sees nothing, as in a pod.
//
// Keys are file names relative to dir (a key with "/" makes subdirectories;
// the visible symlink is its first segment). mode is each file's permission.
func WriteAtomicDir(dir string, payload map[string][]byte, mode os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return err
	}
	visible := map[string]bool{}
	for key, data := range payload {
		if key == "" || strings.HasPrefix(key, "..") || filepath.IsAbs(key) || strings.Contains(key, "/../") {
			return fmt.Errorf("atomic dir %s: bad key %q", dir, key)
		}
		p := filepath.Join(ts, key)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil { // WriteFile's mode passes the umask
			return err
		}
		visible[strings.SplitN(key, "/", 2)[0]] = true
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, "..") || visible[n] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(visible))
	for n := range visible {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		link := filepath.Join(dir, n)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", n) {
			continue
		}
		_ = os.RemoveAll(link)
		if err := os.Symlink(filepath.Join("..data", n), link); err != nil {
			return err
		}
	}
	if old != "" && old != filepath.Base(ts) {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
