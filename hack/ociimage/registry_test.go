package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// small returns a one-file image, quick to push.
func small(t *testing.T, content string) v1.Image {
	t.Helper()
	l, err := layer([]file{{Path: "/etc/hello", Mode: 0o644, Data: []byte(content)}})
	if err != nil {
		t.Fatal(err)
	}
	img, err := newImage("amd64", config{Entrypoint: []string{"/hello"}}, l)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// headManifest asks url for a manifest as containerd does and wants 200
// with digest want.
func headManifest(t *testing.T, url string, want v1.Hash) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodHead, url, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Docker-Content-Digest") != want.String() {
		t.Errorf("HEAD %s: %d digest %q, want 200 %s", req.URL, resp.StatusCode, resp.Header.Get("Docker-Content-Digest"), want)
	}
}

func startRegistry(t *testing.T) *Registry {
	t.Helper()
	r, err := StartRegistry("", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"nginx:1.23-alpine":                             "docker.io/library/nginx:1.23-alpine",
		"nginx":                                         "docker.io/library/nginx:latest",
		"docker.io/library/nginx:1.23-alpine":           "docker.io/library/nginx:1.23-alpine",
		"index.docker.io/foo/bar:1":                     "docker.io/foo/bar:1",
		"ghcr.io/hookwright/proxy:1.4.2":                "ghcr.io/hookwright/proxy:1.4.2",
		"127.0.0.1:5000/hookwright-bundle:v1":           "127.0.0.1:5000/hookwright-bundle:v1",
		"quay.io/a/b@sha256:" + strings.Repeat("a", 64): "quay.io/a/b@sha256:" + strings.Repeat("a", 64),
	} {
		if got, err := normalize(in); err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := normalize("UPPER/case:x"); err == nil {
		t.Error("Normalize accepted an invalid name")
	}
}

func TestStartRegistryOnlyOnLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:5000", "localhost:0", "127.0.0.1"} {
		if r, err := StartRegistry(addr, nil); err == nil {
			r.Close()
			t.Errorf("StartRegistry(%q) started", addr)
		}
	}
	if err := Push(context.Background(), "10.0.0.1:5000", Named{Name: "x", Image: small(t, "x")}); err == nil {
		t.Error("Push to a non-loopback registry went ahead")
	}
}

// Images pushed by their public names come back from the local registry
// under LocalReference, and containerd's request for the public name (the
// path the hosts.toml sends it to, with its ?ns= query) finds them.
func TestPushAndResolveLikeContainerd(t *testing.T) {
	r := startRegistry(t)
	imgs := []Named{
		{Name: "nginx:1.23-alpine", Image: small(t, "nginx")},
		{Name: "ghcr.io/hookwright/proxy:1.4.2", Image: small(t, "proxy")},
		{Name: r.Addr + "/hookwright-bundle:v0.1.0", Image: small(t, "bundle")},
	}
	if err := r.Push(context.Background(), imgs...); err != nil {
		t.Fatal(err)
	}
	hosts, err := containerdHosts(r.Addr, MirroredRegistries)
	if err != nil {
		t.Fatal(err)
	}
	serverRE := regexp.MustCompile(`(?m)^server = "([^"]+)"`)
	for _, tc := range []struct {
		img               v1.Image
		hostDir, ns, repo string
		tag               string
	}{
		{imgs[0].Image, "docker.io", "docker.io", "library/nginx", "1.23-alpine"},
		{imgs[1].Image, "ghcr.io", "ghcr.io", "hookwright/proxy", "1.4.2"},
		{imgs[2].Image, hostDirectory(r.Addr), r.Addr, "hookwright-bundle", "v0.1.0"},
	} {
		want, _ := tc.img.Digest()
		ref, _ := LocalReference(r.Addr, tc.ns+"/"+tc.repo+":"+tc.tag)
		got, err := remote.Image(ref)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if d, _ := got.Digest(); d != want {
			t.Errorf("%s: digest %s, want %s", ref, d, want)
		}

		m := serverRE.FindStringSubmatch(hosts[tc.hostDir+"/hosts.toml"])
		if m == nil {
			t.Fatalf("no server in %s/hosts.toml:\n%s", tc.hostDir, hosts[tc.hostDir+"/hosts.toml"])
		}
		root := m[1]
		if !strings.Contains(hosts[tc.hostDir+"/hosts.toml"], "override_path = true") {
			root += "/v2" // containerd appends the API root unless told not to
		}
		headManifest(t, root+"/"+tc.repo+"/manifests/"+tc.tag+"?ns="+tc.ns, want)
	}

	// Any other registry lands on the empty prefix: not found, locally.
	m := serverRE.FindStringSubmatch(hosts["_default/hosts.toml"])
	resp, err := http.Get(m[1] + "/library/nginx/manifests/1.23-alpine?ns=example.com")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("_default pull: %d, want 404", resp.StatusCode)
	}
}

// StartTLS serves the same images over HTTPS with a certificate for the
// registry's IP signed by the registry's own CA; PushTo pushes through it
// with the CA trusted; WriteTLSFiles writes the CA and a trust store with
// the system's CAs first; containerdTLSHosts sends containerd to it with
// that CA.
func TestRegistryTLS(t *testing.T) {
	r := startRegistry(t)
	if err := r.StartTLS(); err != nil {
		t.Fatal(err)
	}
	if err := r.StartTLS(); err == nil {
		t.Error("second StartTLS accepted")
	}
	img := small(t, "bundle")
	want, _ := img.Digest()
	if err := r.Push(context.Background(), Named{Name: r.Addr + "/hookwright-bundle:v0.1.0", Image: img}); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(r.CAPEM) {
		t.Fatalf("CAPEM %q", r.CAPEM)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	ref, err := name.ParseReference(r.TLSAddr + "/hookwright-bundle:v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(ref, remote.WithTransport(tr))
	if err != nil {
		t.Fatalf("pull %s over TLS: %v", ref, err)
	}
	if d, _ := got.Digest(); d != want {
		t.Errorf("TLS pull digest %s, want %s", d, want)
	}
	// HTTP/1.1 only, even to a client that offers h2: uploads sharing one
	// HTTP/2 connection deadlock on the registry's blob lock.
	h2 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	resp, err := (&http.Client{Transport: h2}).Get("https://" + r.TLSAddr + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 1 {
		t.Errorf("TLS listener answered %s, want HTTP/1.1", resp.Proto)
	}
	// Without the CA the certificate is not trusted.
	if _, err := remote.Image(ref, remote.WithTransport(&http.Transport{})); err == nil {
		t.Error("TLS pull without the registry's CA succeeded")
	}
	block, _ := pem.Decode(r.CAPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !ca.IsCA || ca.NotAfter.Before(time.Now().Add(29*24*time.Hour)) {
		t.Errorf("CA %v: IsCA %v, NotAfter %v", err, ca != nil && ca.IsCA, ca.NotAfter)
	}

	dir := t.TempDir()
	system := filepath.Join(dir, "system.pem")
	if err := os.WriteFile(system, []byte("# system"), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := r.WriteTLSFiles(filepath.Join(dir, "registry"), system)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(files.CA); !bytes.Equal(b, r.CAPEM) {
		t.Errorf("%s = %q", files.CA, b)
	}
	if b, _ := os.ReadFile(files.Trust); string(b) != "# system\n"+string(r.CAPEM) {
		t.Errorf("%s = %q", files.Trust, b)
	}
	// PushTo the HTTPS address: verified with the CA as SSL_CERT_FILE.
	t.Setenv("SSL_CERT_FILE", files.Trust)
	other := small(t, "other")
	if err := PushTo(context.Background(), r.TLSAddr, false, Named{Name: "ghcr.io/hookwright/other:v1", Image: other}); err != nil {
		t.Fatalf("PushTo %s: %v", r.TLSAddr, err)
	}
	headManifest(t, "http://"+r.Addr+"/v2/ghcr.io/hookwright/other/manifests/v1", digestOf(t, other))

	hosts, err := containerdTLSHosts(r.TLSAddr, files.CA)
	if err != nil {
		t.Fatal(err)
	}
	toml := hosts[hostDirectory(r.TLSAddr)+"/hosts.toml"]
	if len(hosts) != 1 || !strings.Contains(toml, `server = "https://`+r.TLSAddr+`"`) ||
		!strings.Contains(toml, `ca = "`+files.CA+`"`) || strings.Contains(toml, "override_path") {
		t.Fatalf("TLS hosts %v", hosts)
	}
	for _, bad := range [][2]string{{"10.0.0.1:5000", "/ca.crt"}, {"127.0.0.1", "/ca.crt"}, {"127.0.0.1:5000", "ca.crt"}} {
		if _, err := containerdTLSHosts(bad[0], bad[1]); err == nil {
			t.Errorf("containerdTLSHosts(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

// PushTo a registry off this machine: HTTPS verified unless insecure, and
// never plain HTTP (go-containerregistry would fall back to it for a
// private address).
func TestPushToRemoteRefusesPlainHTTP(t *testing.T) {
	rt := httpsOnly{http.DefaultTransport}
	req, _ := http.NewRequest(http.MethodGet, "http://10.1.2.3:5000/v2/", nil)
	if _, err := rt.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "IMAGE_REGISTRY_INSECURE") {
		t.Errorf("plain HTTP to 10.1.2.3: %v", err)
	}
	for _, bad := range []string{"registry.example.com/path", "a b", "user@host"} {
		if _, err := RemoteOptions(context.Background(), bad, false); err == nil {
			t.Errorf("RemoteOptions(%q) accepted", bad)
		}
	}
	ref, err := LocalReference("registry.example.com:5000", "ghcr.io/hookwright/hookwright:v0.1.0")
	if err != nil || ref.Context().Scheme() != "https" || ref.String() != "registry.example.com:5000/ghcr.io/hookwright/hookwright:v0.1.0" {
		t.Errorf("LocalReference off the machine = %v (scheme %s), %v", ref, ref.Context().Scheme(), err)
	}
}

func digestOf(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestContainerdHosts(t *testing.T) {
	got, err := containerdHosts("127.0.0.1:5000", []string{"ghcr.io", "docker.io"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"docker.io/hosts.toml": `# Written by hookwright's hack/ociimage. docker.io's images come from the local registry only (no upstream fallback).
server = "http://127.0.0.1:5000/v2/docker.io"
capabilities = ["pull", "resolve"]
override_path = true
`,
		"ghcr.io/hosts.toml": `# Written by hookwright's hack/ociimage. ghcr.io's images come from the local registry only (no upstream fallback).
server = "http://127.0.0.1:5000/v2/ghcr.io"
capabilities = ["pull", "resolve"]
override_path = true
`,
		"127.0.0.1_5000_/hosts.toml": `# Written by hookwright's hack/ociimage. The local registry itself.
server = "http://127.0.0.1:5000"
capabilities = ["pull", "resolve"]
`,
		"_default/hosts.toml": `# Written by hookwright's hack/ociimage. Any other registry: an empty prefix of the local registry, so its pulls fail here.
server = "http://127.0.0.1:5000/v2/unmirrored"
capabilities = ["pull", "resolve"]
override_path = true
`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ContainerdHosts (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		addr string
		ups  []string
	}{
		{"10.1.2.3:5000", nil},
		{"127.0.0.1", nil},
		{"127.0.0.1:5000", []string{"index.docker.io"}},
		{"127.0.0.1:5000", []string{"Docker.io"}},
		{"127.0.0.1:5000", []string{"ghcr.io/x"}},
		{"127.0.0.1:5000", []string{`a"]`}},
		{"127.0.0.1:5000", []string{"_default"}},
	} {
		if _, err := containerdHosts(tc.addr, tc.ups); err == nil {
			t.Errorf("ContainerdHosts(%q, %q) accepted", tc.addr, tc.ups)
		}
	}

	dir := t.TempDir()
	if err := WriteContainerdHosts(dir, "127.0.0.1:5000", []string{"ghcr.io", "docker.io"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "ghcr.io", "hosts.toml"))
	if err != nil || string(b) != want["ghcr.io/hosts.toml"] {
		t.Errorf("written ghcr.io/hosts.toml = %q, %v", b, err)
	}
}

// The archive is an OCI layout in a tar, each image named for
// `ctr images import` by io.containerd.image.name.
func TestWriteArchive(t *testing.T) {
	imgs := []Named{{Name: "nginx:1.23-alpine", Image: small(t, "a")}, {Name: "ghcr.io/hookwright/proxy:1.4.2", Image: small(t, "b")}}
	dir := t.TempDir()
	archive := filepath.Join(dir, "images.tar")
	if err := WriteArchive(archive, imgs...); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "x")
	untar(t, archive, out)
	if _, err := os.Stat(filepath.Join(out, "oci-layout")); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var names, tags []string
	for i, d := range im.Manifests {
		names = append(names, d.Annotations[annotationImageName])
		tags = append(tags, d.Annotations[annotationRefName])
		if want, _ := imgs[i].Image.Digest(); d.Digest != want || d.Platform == nil || d.Platform.Architecture != "amd64" {
			t.Errorf("entry %d: %s %+v, want %s with its platform", i, d.Digest, d.Platform, want)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := img.Layers(); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]string{"docker.io/library/nginx:1.23-alpine", "ghcr.io/hookwright/proxy:1.4.2"}, names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"1.23-alpine", "1.4.2"}, tags); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	if _, err := name.ParseReference(names[0]); err != nil {
		t.Error(err)
	}

	// A layout is replaced; another non-empty directory is left alone.
	if err := WriteLayout(out, imgs[:1]...); err != nil {
		t.Errorf("rewriting a layout: %v", err)
	}
	other := filepath.Join(dir, "other")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(other, imgs...); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Errorf("WriteLayout over a non-layout directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(other, "keep")); err != nil {
		t.Errorf("the directory's file is gone: %v", err)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, fs.FileMode(h.Mode)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLayer(t *testing.T) {
	for _, files := range [][]file{
		{{Path: "etc/x"}},
		{{Path: "/etc/../x"}},
		{{Path: "/"}},
		{{Path: "/a"}, {Path: "/a"}},
		{{Path: "/a", Mode: 0o644}, {Path: "/a/b"}},
		{{Path: "/dev/null", Mode: fs.ModeDevice}},
	} {
		if _, err := layer(files); err == nil {
			t.Errorf("Layer(%+v) accepted", files)
		}
	}
	l, err := layer([]file{
		{Path: "/usr/local/bin/x", Mode: 0o755, Data: []byte("x")},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/bin", Mode: fs.ModeSymlink | 0o777, Link: "usr/bin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name+" "+fs.FileMode(h.Mode).String()+" "+h.Linkname+" "+h.ModTime.UTC().Format("2006"))
	}
	want := []string{
		"bin -rwxrwxrwx usr/bin 1970",
		"tmp/ -rwxrwxrwx  1970", // the sticky bit is in the raw mode (01777)
		"usr/ -rwxr-xr-x  1970",
		"usr/local/ -rwxr-xr-x  1970",
		"usr/local/bin/ -rwxr-xr-x  1970",
		"usr/local/bin/x -rwxr-xr-x  1970",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
}

// The operator binary must not carry the image builder (it stays out of
// everything cmd/ imports).
func TestOperatorBinaryDoesNotLinkImages(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.Contains(dep, "go-containerregistry") || strings.HasSuffix(dep, "/hack/ociimage") {
			t.Errorf("./cmd depends on %s", dep)
		}
	}
}

// Serve is Build, StartRegistry and Push: every image of the sets is there.
func TestServe(t *testing.T) {
	r, imgs, err := Serve(context.Background(), Options{Root: root, BinDir: t.TempDir()}, SetPause, SetStandins)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(imgs) != 7 {
		t.Fatalf("%d images, want pause and 6 stand-ins", len(imgs))
	}
	for _, n := range imgs {
		ref, err := LocalReference(r.Addr, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := n.Image.Digest()
		desc, err := remote.Head(ref)
		if err != nil || desc.Digest != want {
			t.Errorf("%s: %v %v, want %s", ref, desc, err, want)
		}
	}
}

// The same inputs give the same digests (fixed timestamps, sorted
// entries), so a rebuild does not re-push or re-pull anything.
func TestReproducible(t *testing.T) {
	a, b := small(t, "same"), small(t, "same")
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("digests %s and %s from the same inputs", da, db)
	}
	bundle1, err := Bundle("amd64", root+"/bundle")
	if err != nil {
		t.Fatal(err)
	}
	bundle2, _ := Bundle("amd64", root+"/bundle")
	d1, _ := bundle1.Digest()
	d2, _ := bundle2.Digest()
	if d1 != d2 {
		t.Errorf("bundle digests %s and %s", d1, d2)
	}
}
