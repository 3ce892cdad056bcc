package ociimage

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"
)

// The images `operator-sdk run bundle` (v1.42.2) and OLM's catalog
// operator (v0.33.0) run as pods, under their default names so neither
// needs a flag.
const (
	// BundleName is the Makefile's BUNDLE_IMG for VERSION 0.1.0. The
	// operator-sdk client pulls the bundle itself, so a caller renames it to
	// <local registry>/hookwright-bundle:v0.1.0 before pushing.
	BundleName = "ghcr.io/hookwright/hookwright-bundle:v0.1.0"
	// opmName is operator-sdk's default --index-image (its registry pod runs
	// `sh -c "opm serve ..."`) and the catalog operator's default --opmImage
	// (bundle unpack Jobs run `opm alpha bundle extract`).
	opmName = "quay.io/operator-framework/opm:latest"
	// olmUtilName is the catalog operator's default --util-image: unpack
	// Jobs run its /bin/cp to copy its /bin/cpb into the bundle container.
	olmUtilName = "quay.io/operator-framework/olm:latest"
	// decompressionName is operator-sdk's default --decompression-image:
	// its init container runs sh, cat and gzip -d on the catalog ConfigMaps.
	decompressionName = "registry.access.redhat.com/ubi9/ubi:9.7"
	// IndexName is an empty file-based catalog image (see index), the
	// --index-image of `operator-sdk run bundle` here.
	IndexName = "ghcr.io/hookwright/hookwright-index:empty"
)

// indexConfigsLabel says where a catalog image keeps its file-based
// catalog (operator-registry pkg/containertools ConfigsLocationLabel);
// operator-sdk treats an --index-image with it as a file-based catalog.
const indexConfigsLabel = "operators.operatorframework.io.index.configs.v1"

// DefaultBusybox is where Debian's busybox-static package installs its
// (static) binary.
const DefaultBusybox = "/bin/busybox"

// busyboxApplets get a /bin symlink in the images that carry busybox: the
// shell and what the OLM and operator-sdk pods' commands call.
var busyboxApplets = []string{
	"cat", "cp", "echo", "env", "false", "grep", "gzip", "gunzip", "ln", "ls", "mkdir",
	"mv", "rm", "sed", "sh", "sleep", "tar", "test", "true", "zcat",
}

// bundleDirs are what bundle.Dockerfile copies, from bundle/ to /.
var bundleDirs = []string{"manifests", "metadata", "tests/scorecard"}

// Bundle returns the bundle image of dir (the repository's bundle/): its
// manifests/, metadata/ and tests/scorecard/ at /manifests/, /metadata/ and
// /tests/scorecard/, labelled with metadata/annotations.yaml's annotations,
// which is what bundle.Dockerfile copies and labels (operator-sdk generate
// bundle writes both from the same values; TestBundleImageMatchesDockerfile
// holds them equal).
func Bundle(arch, dir string) (v1.Image, error) {
	b, err := os.ReadFile(filepath.Join(dir, "metadata", "annotations.yaml"))
	if err != nil {
		return nil, fmt.Errorf("ociimage: bundle: %w", err)
	}
	var meta struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.UnmarshalStrict(b, &meta); err != nil {
		return nil, fmt.Errorf("ociimage: bundle: metadata/annotations.yaml: %w", err)
	}
	if len(meta.Annotations) == 0 {
		return nil, fmt.Errorf("ociimage: bundle: metadata/annotations.yaml has no annotations")
	}
	var files []file
	for _, d := range bundleDirs {
		src := filepath.Join(dir, filepath.FromSlash(d))
		err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			dst := "/" + filepath.ToSlash(rel)
			switch {
			case e.IsDir():
				files = append(files, file{Path: dst, Mode: fs.ModeDir | 0o755})
			case e.Type().IsRegular():
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				files = append(files, file{Path: dst, Mode: 0o644, Data: data})
			default:
				return fmt.Errorf("%s: not a regular file or directory", p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("ociimage: bundle: %w", err)
		}
	}
	l, err := layer(files)
	if err != nil {
		return nil, err
	}
	return newImage(arch, config{Labels: meta.Annotations}, l)
}

// busyboxFiles are /bin/busybox and its applets' symlinks.
func busyboxFiles(busybox []byte) []file {
	files := []file{{Path: "/bin/busybox", Mode: 0o755, Data: busybox}}
	for _, a := range busyboxApplets {
		files = append(files, file{Path: path.Join("/bin", a), Mode: fs.ModeSymlink | 0o777, Link: "busybox"})
	}
	return files
}

// userFiles are a minimal /etc/passwd and /etc/group with root and uid, and
// a sticky /tmp (opm serve caches under it).
func userFiles(uid int) []file {
	return []file{
		{Path: "/etc/passwd", Mode: 0o644, Data: fmt.Appendf(nil, "root:x:0:0:root:/root:/bin/sh\nuser:x:%d:0:user:/tmp:/bin/sh\n", uid)},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\n")},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}
}

// OPM returns the opm image: opm at /bin/opm and busybox for the shell,
// user 1001 and ENTRYPOINT ["/bin/opm"] like operator-registry's opm image
// (whose distroless/static:debug base carries busybox too).
func opmImage(arch, opm, busybox string) (v1.Image, error) {
	return withBusybox(arch, opm, "/bin/opm", busybox,
		config{User: "1001", WorkingDir: "/", Entrypoint: []string{"/bin/opm"}})
}

// index returns an empty file-based catalog image, what `opm generate
// dockerfile` builds for a catalog without packages: the OPM image with an
// empty /configs, labelled indexConfigsLabel=/configs, CMD ["serve",
// "/configs", "--cache-dir=/tmp/cache"]. operator-sdk run bundle renders
// it (no bundles), adds the bundle and serves the result from a registry
// pod running this image; without the label it would take the image for
// a SQLite index.
func index(arch, opm, busybox string) (v1.Image, error) {
	cfg := config{
		User: "1001", WorkingDir: "/", Entrypoint: []string{"/bin/opm"},
		Cmd:    []string{"serve", "/configs", "--cache-dir=/tmp/cache"},
		Labels: map[string]string{indexConfigsLabel: "/configs"},
	}
	configs, err := layer([]file{{Path: "/configs", Mode: fs.ModeDir | 0o755}})
	if err != nil {
		return nil, err
	}
	return withBusybox(arch, opm, "/bin/opm", busybox, cfg, configs)
}

// olmUtil returns the util image of bundle unpack Jobs: busybox (its cp)
// and OLM's cpb at /bin/cpb.
func olmUtil(arch, cpb, busybox string) (v1.Image, error) {
	return withBusybox(arch, cpb, "/bin/cpb", busybox, config{User: "1001", WorkingDir: "/"})
}

// withBusybox is a busybox base layer (user 1001) under one static
// program copied to path, then the extra layers.
func withBusybox(arch, program, path, busybox string, cfg config, extra ...v1.Layer) (v1.Image, error) {
	bin, err := readStatic(program)
	if err != nil {
		return nil, err
	}
	bb, err := readBusybox(busybox)
	if err != nil {
		return nil, err
	}
	base, err := layer(append(busyboxFiles(bb), userFiles(1001)...))
	if err != nil {
		return nil, err
	}
	app, err := layer([]file{{Path: path, Mode: 0o755, Data: bin}})
	if err != nil {
		return nil, err
	}
	return newImage(arch, cfg, append([]v1.Layer{base, app}, extra...)...)
}

// decompression returns the image of operator-sdk's decompression init
// container: busybox alone (sh, cat, gzip), root like ubi.
func decompression(arch, busybox string) (v1.Image, error) {
	bb, err := readBusybox(busybox)
	if err != nil {
		return nil, err
	}
	l, err := layer(append(busyboxFiles(bb), userFiles(1001)...))
	if err != nil {
		return nil, err
	}
	return newImage(arch, config{WorkingDir: "/", Cmd: []string{"/bin/sh"}}, l)
}

func readBusybox(p string) ([]byte, error) {
	b, err := readStatic(p)
	if err != nil {
		return nil, fmt.Errorf("%w (the OLM images need a static busybox: Debian's busybox-static, apt-get install busybox-static)", err)
	}
	return b, nil
}

// readStatic reads an executable and fails unless it is a static ELF: the
// images have no libc.
func readStatic(p string) ([]byte, error) {
	b, err := readExecutable(p)
	if err != nil {
		return nil, err
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("ociimage: %s: %w", p, err)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("ociimage: %s is dynamically linked; the image has no libc", p)
		}
	}
	return b, nil
}
