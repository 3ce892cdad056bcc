// Package ociimage builds this repository's container images without a
// Docker engine, serves them from a registry on 127.0.0.1 and writes them
// as OCI layouts and archives (`ctr images import`), all through
// go-containerregistry: this package only composes files and image configs.
//
// The images: the operator (the Dockerfile's final stage, see operator),
// containerd's sandbox (pause), stand-ins for the workload images our
// scenarios name since no public registry is reachable here (Standins), and
// what `operator-sdk run bundle` runs (Bundle). containerdHosts maps their
// public names to the local registry.
//
// It is build and test tooling, so it lives under hack/ beside the commands
// that drive it (hack/imagectl, hack/runbundle); the cluster tests import it
// too. Nothing under cmd/ imports it, so the operator binary carries none of
// it (TestOperatorBinaryDoesNotLinkImages).
//
// It must not import the operator's packages (controllers, webhooks, cmd).
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Named is an image with the full reference it is known by, in the
// containerd/Docker normalized form (docker.io/library/nginx:1.23-alpine).
type Named struct {
	Name  string
	Image v1.Image
}

// file is one entry of a layer. Path is absolute and clean; Mode carries
// the type (fs.ModeDir, fs.ModeSymlink, or none for a regular file) and the
// permission bits (fs.ModeSticky included). Link is a symlink's target.
type file struct {
	Path     string
	Mode     fs.FileMode
	UID, GID int
	Data     []byte
	Link     string
}

// epoch is every entry's and image's timestamp, so a build from the same
// inputs gives the same digests (ko and distroless do the same).
var epoch = time.Unix(0, 0).UTC()

// layer returns an OCI layer (gzip) holding files, plus any missing parent
// directory (root-owned, 0755). Entries are sorted by path. An error names
// a relative or unclean path, or a path given twice.
func layer(files []file) (v1.Layer, error) {
	byPath := map[string]file{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("ociimage: layer path %q: want an absolute, clean path below /", f.Path)
		}
		if _, dup := byPath[f.Path]; dup {
			return nil, fmt.Errorf("ociimage: layer path %q given twice", f.Path)
		}
		byPath[f.Path] = f
	}
	for _, f := range files {
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = file{Path: d, Mode: fs.ModeDir | 0o755}
			} else if !byPath[d].Mode.IsDir() {
				return nil, fmt.Errorf("ociimage: layer path %q is below %q, which is not a directory", f.Path, d)
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := byPath[p]
		h := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			Mode:    int64(f.Mode.Perm()),
			Uid:     f.UID,
			Gid:     f.GID,
			ModTime: epoch,
			Format:  tar.FormatPAX,
		}
		if f.Mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case f.Mode.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.Mode&fs.ModeSymlink != 0:
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		case f.Mode.IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		default:
			return nil, fmt.Errorf("ociimage: layer path %q: unsupported mode %v", p, f.Mode)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	// The layer is gzipped once, for its digest, and those bytes are kept:
	// without the cache every push and size read gzipped it again (about
	// 1 s per 75 MB layer, and make test pushes a few dozen layers).
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// config is the part of an image's config our images set.
type config struct {
	// User is "uid:gid" or "uid"; empty means root, as in a Dockerfile.
	User       string
	WorkingDir string
	Entrypoint []string
	Cmd        []string
	Env        []string
	// Labels are the image's labels (Dockerfile LABEL); nil for none.
	Labels map[string]string
	// ExposedPorts are "80/tcp"-style ports (Dockerfile EXPOSE).
	ExposedPorts []string
}

// defaultPath is the PATH Docker and distroless give an image.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// New returns an OCI image for linux/arch with cfg and the layers, built on
// an empty base (FROM scratch). Env gets the default PATH unless cfg sets one.
func newImage(arch string, cfg config, layers ...v1.Layer) (v1.Image, error) {
	if arch == "" {
		return nil, fmt.Errorf("ociimage: an architecture is required")
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: epoch}
	env := cfg.Env
	if !hasEnv(env, "PATH") {
		env = append([]string{defaultPath}, env...)
	}
	cf.Config = v1.Config{
		User:       cfg.User,
		WorkingDir: cfg.WorkingDir,
		Entrypoint: cfg.Entrypoint,
		Cmd:        cfg.Cmd,
		Env:        env,
		Labels:     cfg.Labels,
	}
	if len(cfg.ExposedPorts) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range cfg.ExposedPorts {
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	// One history entry per layer, as a builder writes them.
	cf.History = nil
	for range layers {
		cf.History = append(cf.History, v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "hookwright hack/ociimage"})
	}
	return mutate.ConfigFile(img, cf)
}

func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

// ImageSizes are an image's byte counts: Compressed is what a registry
// stores and a pull transfers (layers as stored, config, manifest);
// Uncompressed is the layers' tar size, about what the node unpacks.
type ImageSizes struct {
	Compressed, Uncompressed int64
}

// Sizes returns img's imageSizes.
func Sizes(img v1.Image) (ImageSizes, error) {
	var s ImageSizes
	m, err := img.RawManifest()
	if err != nil {
		return s, err
	}
	c, err := img.RawConfigFile()
	if err != nil {
		return s, err
	}
	s.Compressed = int64(len(m) + len(c))
	layers, err := img.Layers()
	if err != nil {
		return s, err
	}
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return s, err
		}
		s.Compressed += n
		rc, err := l.Uncompressed()
		if err != nil {
			return s, err
		}
		u, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return s, err
		}
		s.Uncompressed += u
	}
	return s, nil
}
