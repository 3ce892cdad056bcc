package cluster

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Images every real node imports before its kubelet starts. No registry is
// reachable from a node, so these are all a pod can run besides what a test
// imports itself (RealNode.ImportImages).
const (
	// PauseImage is containerd's sandbox image (the pod's first process).
	PauseImage = "hookwright.local/pause:v1"
	// AgentImage serves HTTP on :8080 (see test/cluster/nodeagent); its
	// `get URL [WANT]` mode is an HTTP client for pods that test a path.
	AgentImage = "hookwright.local/nodeagent:v1"
)

// NodeImageUser is the user and group of the harness's images, as in the
// operator's Dockerfile (distroless nonroot).
const NodeImageUser = "65532:65532"

// buildNodeAgent builds test/cluster/nodeagent as a static binary at out.
func buildNodeAgent(root, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./test/cluster/nodeagent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./test/cluster/nodeagent: %v\n%s", err, b)
	}
	return nil
}

// singleBinaryImage is a one-layer OCI image holding bin at /nodeagent, run
// as NodeImageUser with entrypoint /nodeagent followed by args.
func singleBinaryImage(bin []byte, args ...string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mod := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Name: "etc/", Mode: 0o755, ModTime: mod, Typeflag: tar.TypeDir}); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "nodeagent", Mode: 0o755, Size: int64(len(bin)), ModTime: mod, Typeflag: tar.TypeReg}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	// The kubelet passes only the image's uid to the runtime (RunAsUser from
	// the image config, pkg/kubelet/kuberuntime/security_context.go), and
	// runc takes the group from /etc/passwd: without these files a pod that
	// sets no runAsGroup runs with gid 0. Distroless nonroot ships the same.
	for _, f := range [][2]string{
		{"etc/passwd", "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
		{"etc/group", "root:x:0:\nnonroot:x:65532:\n"},
	} {
		name, body := f[0], f[1]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: mod, Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			return nil, err
		}
	}
	// /tmp is where a read-only root file system still lets a volume mount.
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Mode: 0o1777, ModTime: mod, Typeflag: tar.TypeDir}); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = append([]string{"/nodeagent"}, args...)
	cf.Config.User = NodeImageUser
	cf.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cf)
}

// writeOCIArchive writes images (reference -> image) as one tar of an OCI
// image layout, the archive `ctr images import` reads: each manifest carries
// containerd's image-name annotation, so the import names it.
func writeOCIArchive(path string, images map[string]v1.Image) error {
	dir, err := os.MkdirTemp(filepath.Dir(path), "layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	for ref, img := range images {
		if err := lp.AppendImage(img,
			layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
			layout.WithAnnotations(map[string]string{
				"io.containerd.image.name":          ref,
				"org.opencontainers.image.ref.name": ref,
			})); err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// NodeAgentImage builds test/cluster/nodeagent into a one-layer OCI image
// run as NodeImageUser whose entrypoint is /nodeagent followed by args
// (e.g. "serve"), for a test to push to a registry.
func NodeAgentImage(args ...string) (v1.Image, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "hw-agent-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "nodeagent")
	if err := buildNodeAgent(root, bin); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return singleBinaryImage(data, args...)
}

// writeNodeImages builds nodeagent and writes PauseImage and AgentImage
// into one OCI archive at path.
func writeNodeImages(root, path string) error {
	bin := filepath.Join(filepath.Dir(path), "nodeagent")
	if err := buildNodeAgent(root, bin); err != nil {
		return err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	pause, err := singleBinaryImage(data, "pause")
	if err != nil {
		return err
	}
	agent, err := singleBinaryImage(data, "serve")
	if err != nil {
		return err
	}
	return writeOCIArchive(path, map[string]v1.Image{PauseImage: pause, AgentImage: agent})
}
