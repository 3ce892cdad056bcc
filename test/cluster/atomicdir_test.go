package cluster

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteAtomicDir(t *testing.T) {
	dir := t.TempDir()
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if err := WriteAtomicDir(dir, map[string][]byte{"tls.crt": []byte("c1"), "tls.key": []byte("k1")}, 0o440); err != nil {
		t.Fatal(err)
	}
	first, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	if read("tls.crt") != "c1" || read("tls.key") != "k1" {
		t.Fatal("first payload not readable")
	}
	if l, err := os.Readlink(filepath.Join(dir, "tls.crt")); err != nil || l != filepath.Join("..data", "tls.crt") {
		t.Fatalf("tls.crt link %q, %v", l, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "tls.key")); err != nil || st.Mode().Perm() != 0o440 {
		t.Fatalf("mode %v, %v", st.Mode(), err)
	}
	if err := WriteAtomicDir(dir, map[string][]byte{"tls.crt": []byte("c2"), "sub/x": []byte("x")}, 0o644); err != nil {
		t.Fatal(err)
	}
	second, _ := os.Readlink(filepath.Join(dir, "..data"))
	if second == first {
		t.Fatal("..data not swapped")
	}
	if _, err := os.Stat(filepath.Join(dir, first)); !os.IsNotExist(err) {
		t.Fatalf("old payload dir %s still there: %v", first, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "tls.key")); !os.IsNotExist(err) {
		t.Fatalf("removed key still visible: %v", err)
	}
	if read("tls.crt") != "c2" || read("sub/x") != "x" {
		t.Fatal("second payload not readable")
	}
	if err := WriteAtomicDir(dir, map[string][]byte{"../evil": nil}, 0o644); err == nil {
		t.Fatal("key with .. accepted")
	}
}
