package ociimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const root = "../.."

// The binaries are built once per test binary; building the operator is
// the slow part.
var (
	buildOnce sync.Once
	built     map[string]v1.Image
	buildErr  error
)

func images(t *testing.T) map[string]v1.Image {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ociimage-test-")
		if err != nil {
			buildErr = err
			return
		}
		defer os.RemoveAll(dir) // the images hold the binaries' bytes
		named, err := Build(context.Background(), Options{Root: root, BinDir: dir, Version: "v0.1.0-test", GitCommit: "abc123"})
		if err != nil {
			buildErr = err
			return
		}
		built = map[string]v1.Image{}
		for _, n := range named {
			built[n.Name] = n.Image
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// entry is one file of an image's flattened filesystem.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// flatten reads the image's filesystem as a container runtime unpacks it.
func flatten(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files["/"+strings.TrimSuffix(path.Clean(h.Name), "/")] = entry{h, data}
	}
}

// unpack writes the flattened filesystem under dir (as root, with owners).
func unpack(t *testing.T, files map[string]entry, dir string) {
	t.Helper()
	for p, e := range files {
		dst := filepath.Join(dir, p)
		switch e.hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, fs.FileMode(e.hdr.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, e.data, fs.FileMode(e.hdr.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for p, e := range files {
		dst := filepath.Join(dir, p)
		mode := fs.FileMode(e.hdr.Mode).Perm()
		if e.hdr.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		_ = os.Chmod(dst, mode)
		if os.Geteuid() == 0 {
			_ = os.Lchown(dst, e.hdr.Uid, e.hdr.Gid)
		}
	}
}

// dockerfileStage is what the final stage of a Dockerfile sets.
type dockerfileStage struct {
	From, User, WorkDir string
	Entrypoint, Cmd     []string
	Labels              map[string]string
	Copies              [][2]string
}

// parseDockerfile reads the instructions of the last stage this test needs
// (FROM, USER, WORKDIR, ENTRYPOINT/CMD in exec form, LABEL k=v, COPY).
func parseDockerfile(t *testing.T, file string) dockerfileStage {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var st dockerfileStage
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	cont := ""
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cont += s + " "
			continue
		}
		lines = append(lines, cont+l)
		cont = ""
	}
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			st = dockerfileStage{From: rest}
		case "USER":
			st.User = rest
		case "WORKDIR":
			st.WorkDir = rest
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				t.Fatalf("%s: %s is not in exec form: %v", file, l, err)
			}
			if strings.ToUpper(instr) == "ENTRYPOINT" {
				st.Entrypoint = v
			} else {
				st.Cmd = v
			}
		case "LABEL":
			if st.Labels == nil {
				st.Labels = map[string]string{}
			}
			for kv := range strings.FieldsSeq(rest) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("%s: LABEL %q: want key=value", file, kv)
				}
				st.Labels[k] = strings.Trim(v, `"`)
			}
		case "COPY":
			f := strings.Fields(rest)
			var args []string
			for _, a := range f {
				if !strings.HasPrefix(a, "--") {
					args = append(args, a)
				}
			}
			if len(args) == 2 {
				st.Copies = append(st.Copies, [2]string{args[0], args[1]})
			}
		}
	}
	return st
}

func TestOperatorImageMatchesDockerfile(t *testing.T) {
	img := images(t)[OperatorName]
	df := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	if df.From != "gcr.io/distroless/static:nonroot" {
		t.Fatalf("the Dockerfile's base is now %q: check what OperatorConfig and nonrootBase copy of it", df.From)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	got := dockerfileStage{
		From: df.From, User: cf.Config.User, WorkDir: cf.Config.WorkingDir,
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Labels: cf.Config.Labels, Copies: df.Copies,
	}
	if diff := cmp.Diff(df, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("image config differs from the Dockerfile (-Dockerfile +image):\n%s", diff)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cf.Config.User)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	mt, _ := img.MediaType()
	if mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}

	files := flatten(t, img)
	// No shell, and no program but the operator.
	for p, e := range files {
		if e.hdr.Typeflag == tar.TypeReg && e.hdr.Mode&0o111 != 0 && p != "/hookwright" {
			t.Errorf("executable %s in the image: only /hookwright should be", p)
		}
		if path.Base(p) == "sh" || strings.HasPrefix(p, "/bin") || strings.HasPrefix(p, "/usr") {
			t.Errorf("%s in the image: distroless/static has no shell or /bin", p)
		}
	}
	bin, ok := files["/hookwright"]
	if !ok || bin.hdr.Mode&0o755 != 0o755 {
		t.Fatalf("/hookwright missing or not 0755: %+v", bin.hdr)
	}
	checkStatic(t, "/hookwright", bin.data)

	ca, ok := files["/etc/ssl/certs/ca-certificates.crt"]
	if !ok {
		t.Fatal("no CA certificates at /etc/ssl/certs/ca-certificates.crt")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.data) || bytes.Count(ca.data, []byte("BEGIN CERTIFICATE")) < 10 {
		t.Errorf("CA bundle holds too few certificates (%d bytes)", len(ca.data))
	}
	if !bytes.Contains(files["/etc/passwd"].data, []byte("nonroot:x:65532:65532:")) {
		t.Errorf("/etc/passwd has no nonroot 65532: %q", files["/etc/passwd"].data)
	}
	if tmp := files["/tmp"]; tmp.hdr == nil || tmp.hdr.Mode&0o1777 != 0o1777 {
		t.Errorf("/tmp is not 1777")
	}
	if !hasEnv(cf.Config.Env, "SSL_CERT_FILE") {
		t.Errorf("env %q lacks distroless' SSL_CERT_FILE", cf.Config.Env)
	}

	// The entrypoint runs from the image's files alone, as the image's
	// user when this test runs as root (CI does): chroot into the
	// unpacked filesystem.
	dir := t.TempDir()
	unpack(t, files, dir)
	cmd := exec.Command(cf.Config.Entrypoint[0], "version")
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir, Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
		cmd.Dir = cf.Config.WorkingDir
	} else {
		t.Log("not root: running the extracted /hookwright without chroot")
		cmd.Path = filepath.Join(dir, "hookwright")
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "hookwright v0.1.0-test (commit abc123") {
		t.Fatalf("/hookwright version: %v %q", err, out)
	}
}

// checkStatic fails unless data is an ELF executable for this GOARCH with
// no interpreter and no shared libraries.
func checkStatic(t *testing.T, name string, data []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v program header: not static", name, p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs %v", name, libs)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]
	if want != 0 && f.Machine != want {
		t.Errorf("%s is for %v, want %v", name, f.Machine, want)
	}
}

func TestPauseImage(t *testing.T) {
	img := images(t)[PauseName]
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65535:65535" || cmp.Diff(cf.Config.Entrypoint, []string{"/pause"}) != "" || cf.Architecture != runtime.GOARCH {
		t.Errorf("pause config %+v", cf.Config)
	}
	files := flatten(t, img)
	checkStatic(t, "/pause", files["/pause"].data)
}

// Each stand-in image runs the one program as its role; proxy-init is run
// here from the image with the sample template's arguments (exit 0).
func TestStandinImages(t *testing.T) {
	all := images(t)
	want := map[string][]string{
		nginxName:      {"/usr/sbin/nginx", "-g", "daemon off;"},
		proxyName:      {"/usr/local/bin/proxy"},
		proxyNextName:  {"/usr/local/bin/proxy"},
		proxyInitName:  {"/usr/local/bin/proxy-init"},
		logShipperName: {"/usr/local/bin/log-shipper"},
		StandinName:    {"/usr/local/bin/standin", "serve"},
	}
	for name, argv := range want {
		img, ok := all[name]
		if !ok {
			t.Errorf("no image %s", name)
			continue
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if got := append(append([]string(nil), cf.Config.Entrypoint...), cf.Config.Cmd...); cmp.Diff(argv, got) != "" {
			t.Errorf("%s runs %q, want %q", name, got, argv)
		}
		files := flatten(t, img)
		e, ok := files[argv[0]]
		if !ok || e.hdr.Mode&0o755 != 0o755 {
			t.Errorf("%s: %s missing or not 0755", name, argv[0])
			continue
		}
		checkStatic(t, name+":"+argv[0], e.data)
		// The kubelet passes the runtime only the uid; the gid comes from
		// the image's /etc/passwd, so the user must be there.
		if u := cf.Config.User; u != "" {
			uid, gid, _ := strings.Cut(u, ":")
			if !bytes.Contains(files["/etc/passwd"].data, []byte(":x:"+uid+":"+gid+":")) {
				t.Errorf("%s runs as %s but /etc/passwd has no such user: %q", name, u, files["/etc/passwd"].data)
			}
			if !bytes.Contains(files["/etc/group"].data, []byte(":x:"+gid+":")) {
				t.Errorf("%s runs as %s but /etc/group has no group %s: %q", name, u, gid, files["/etc/group"].data)
			}
		}
	}

	// The two proxy versions are one program under two image IDs (config
	// digests): a kubelet that pulled one never takes it for the other,
	// and an in-place upgrade really changes the container's image.
	if a, b := all[proxyName], all[proxyNextName]; a != nil && b != nil {
		ida, _ := a.ConfigName()
		idb, _ := b.ConfigName()
		if ida == idb {
			t.Errorf("%s and %s share the image ID %s", proxyName, proxyNextName, ida)
		}
	}

	dir := t.TempDir()
	unpack(t, flatten(t, all[proxyInitName]), dir)
	cmd := exec.Command("/usr/local/bin/proxy-init", "redirect", "--proxy-port", "15001", "--proxy-uid", "1337")
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir}
	} else {
		t.Log("not root: running the extracted proxy-init without chroot")
		cmd.Path = filepath.Join(dir, "usr/local/bin/proxy-init")
	}
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "would redirect") {
		t.Fatalf("proxy-init from its image: %v %q, want exit 0", err, out)
	}
}
