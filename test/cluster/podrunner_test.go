package cluster

import (
	"os"
	"path/filepath"
	"testing"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "POD_NAME": "p-1"}
	for in, want := range map[string]string{
		"plain":              "plain",
		"$(A)":               "x",
		"--svc=$(POD_NAME)!": "--svc=p-1!",
		"$$(A)":              "$(A)",
		"$(MISSING)/$(A)":    "$(MISSING)/x",
		"$(unterminated":     "$(unterminated",
		"trailing$":          "trailing$",
		"$x":                 "$x",
	} {
		if got := Expand(in, vars); got != want {
			t.Errorf("Expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReplacePath(t *testing.T) {
	const from, to = "/tmp/certs", "/local/v/serving-cert"
	for in, want := range map[string]string{
		"--cert-dir=/tmp/certs":       "--cert-dir=/local/v/serving-cert",
		"/tmp/certs/tls.crt":          "/local/v/serving-cert/tls.crt",
		"/tmp/certs2":                 "/tmp/certs2",
		"a=/tmp/certs,b=/tmp/certs/x": "a=/local/v/serving-cert,b=/local/v/serving-cert/x",
		"/tmp/certsX:/tmp/certs":      "/tmp/certsX:/local/v/serving-cert",
		"no path here":                "no path here",
	} {
		if got := replacePath(in, from, to); got != want {
			t.Errorf("replacePath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReplacePort(t *testing.T) {
	ports := map[int32]int{9443: 41000, 8081: 41001}
	for in, want := range map[string]string{
		"--webhook-port=9443":               "--webhook-port=41000",
		"--health-probe-bind-address=:8081": "--health-probe-bind-address=:41001",
		"0.0.0.0:8081":                      "0.0.0.0:41001",
		"9443":                              "41000",
		"--replicas=8080":                   "--replicas=8080",
		"v19443":                            "v19443",
		"--metrics-bind-address=:8080":      "--metrics-bind-address=:8080",
		"--webhook-port=9443x":              "--webhook-port=9443x",
		"":                                  "",
	} {
		if got := replacePort(in, ports); got != want {
			t.Errorf("replacePort(%q) = %q, want %q", in, got, want)
		}
	}
}

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
