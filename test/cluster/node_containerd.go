package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hookwright/hookwright/hack/ociimage"
)

func (n *RealNode) startContainerd(ctx context.Context, root string) error {
	dir := filepath.Join(n.Dir, "containerd")
	cfg := filepath.Join(dir, "config.toml")
	if err := writeFiles(map[string]string{
		cfg: containerdConfig(dir, filepath.Join(n.Dir, "cni", "net.d"), n.c.Bin),
		filepath.Join(n.Dir, "cni", "net.d", "10-hwnode.conflist"): cniConfig(n.net, n.Dir),
	}); err != nil {
		return err
	}
	p, err := n.start("containerd", filepath.Join(n.c.Bin, "node", "containerd"), []string{"--config", cfg, "--log-level", "info"})
	if err != nil {
		return err
	}
	if err := WaitFor(ctx, 60*time.Second, "containerd of "+n.Name, func(ctx context.Context) (bool, error) {
		if err := p.exitErr(3000); err != nil {
			return false, err
		}
		_, err := n.ctr(ctx, "version")
		return err == nil, err
	}); err != nil {
		return err
	}
	return n.importNodeImages(ctx, root)
}

// importNodeImages builds hack/ociimage's pause image (the sandbox)
// and StandinName (test/node's workload) and imports them, so the node
// needs no registry to start.
func (n *RealNode) importNodeImages(ctx context.Context, root string) error {
	dir := filepath.Join(n.Dir, "images")
	imgs, err := ociimage.Build(ctx, ociimage.Options{Root: root, BinDir: dir}, ociimage.SetPause, ociimage.SetStandins)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if img.Name == ociimage.PauseName || img.Name == ociimage.StandinName {
			n.Images = append(n.Images, img)
		}
	}
	archive := filepath.Join(dir, "node-images.tar")
	if err := ociimage.WriteArchive(archive, n.Images...); err != nil {
		return err
	}
	return n.ImportImages(ctx, archive)
}

// containerdConfig is containerd's config (version 3, containerd 2.x) for a
// node rooted at dir: every path containerd, its shim and runc write is under
// dir (except the shim sockets, which containerd keeps short under
// /run/containerd/s and removes with each shim). What it sets and why:
//
//   - native snapshotter: works on any file system, no overlay mounts;
//   - SystemdCgroup = false: the kubelet's cgroupDriver is cgroupfs;
//   - restrict_oom_score_adj: this machine's processes lack
//     CAP_SYS_RESOURCE, and a sandbox asking for a lower oom_score_adj fails
//     with "can't get final child's PID from pipe: EOF";
//   - the pinned sandbox image is ociimage.PauseName, imported before the
//     kubelet starts; registry hosts come from dir/certs.d (only what a test adds), so
//     nothing is ever pulled from a public registry;
//   - netns_mounts_under_state_dir: pod network namespaces are pinned under
//     dir, not /run/netns;
//   - NRI and the tracing and metrics endpoints are off.
func containerdConfig(dir, cniConfDir, bin string) string {
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	return `version = 3
root = ` + q(filepath.Join(dir, "root")) + `
state = ` + q(filepath.Join(dir, "state")) + `
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = ` + q(filepath.Join(dir, "containerd.sock")) + `

[ttrpc]
  address = ` + q(filepath.Join(dir, "containerd.sock.ttrpc")) + `

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = ` + q(filepath.Join(dir, "opt")) + `
  [plugins.'io.containerd.transfer.v1.local']
    [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
      platform = "linux/` + runtime.GOARCH + `"
      snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "native"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = ` + q(ociimage.PauseName) + `
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = ` + q(filepath.Join(dir, "certs.d")) + `
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [` + q(filepath.Join(bin, "cni")) + `]
      conf_dir = ` + q(cniConfDir) + `
      max_conf_num = 1
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        runtime_path = ` + q(filepath.Join(bin, "node", "containerd-shim-runc-v2")) + `
        snapshotter = "native"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = ` + q(runcPath) + `
          Root = ` + q(filepath.Join(dir, "runc")) + `
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`
}

// runcPath is Debian's runc (package runc).
const runcPath = "/usr/sbin/runc"

// cniConfig is the node's one CNI network: a bridge in the node's namespace
// with the pods' /24, no masquerade (pods reach only this machine), hairpin
// so a pod reaches itself through a Service, and portmap for hostPort. IPAM
// state is under dir.
func cniConfig(n *nodeNet, dir string) string {
	return `{
  "cniVersion": "1.0.0",
  "name": "` + n.netns() + `",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "` + n.bridge() + `",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "` + n.podSubnet() + `", "gateway": "` + n.podGateway() + `"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "` + filepath.Join(dir, "cni", "ipam") + `"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`
}

// ctr runs bin/node/ctr against the node's containerd in namespace k8s.io
// (the CRI's).
func (n *RealNode) ctr(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--address", n.containerdSocket(), "--namespace", "k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(n.c.Bin, "node", "ctr"), full...)
	// Stdout only: ctr warns on stderr (cgroup v1 is deprecated), and a
	// warning read as a list of IDs would be killed word by word.
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// ImportImages imports an OCI archive (ociimage.WriteArchive) or docker save
// archive into the node's containerd, unpacked for the native snapshotter.
// --local imports in ctr itself: containerd's transfer service unpacks only
// for the snapshotters of its unpack_config. Pods use the images with
// imagePullPolicy Never or IfNotPresent.
func (n *RealNode) ImportImages(ctx context.Context, archive string) error {
	_, err := n.ctr(ctx, "images", "import", "--local", "--snapshotter", "native", "--platform", "linux/"+runtime.GOARCH, archive)
	return err
}

// killTasks kills and deletes every task and container containerd runs for
// the node (what the kubelet left running), so their shims exit.
func (n *RealNode) killTasks(ctx context.Context) error {
	out, err := n.ctr(ctx, "tasks", "ls", "-q")
	if err != nil {
		return err
	}
	var errs []string
	for _, id := range strings.Fields(out) {
		_, _ = n.ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
	}
	for _, id := range strings.Fields(out) {
		// Wait for the kill to land; delete fails while the task runs.
		// A task that will not go is found when its container is deleted.
		_, _ = Poll(ctx, 100*time.Millisecond, 10*time.Second, "task "+id+" deleted", func(ctx context.Context) (bool, error) {
			_, err := n.ctr(ctx, "tasks", "delete", "--force", id)
			return err == nil, nil
		})
	}
	cs, err := n.ctr(ctx, "containers", "ls", "-q")
	if err != nil {
		return err
	}
	// libcni caches each sandbox's results (both networks: ours and
	// containerd's cni-loopback) under /var/lib/cni by container ID.
	n.containerIDs = append(n.containerIDs, strings.Fields(cs)...)
	for _, id := range strings.Fields(cs) {
		if _, err := n.ctr(ctx, "containers", "delete", id); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// addRegistry relays the registry at spec.Registry (127.0.0.1:port on the
// host), and its HTTPS listener spec.RegistryTLS if any, into the node's
// namespace and writes containerd's hosts.toml files under certs.d
// (ociimage.WriteContainerdHosts for the mirrors,
// ociimage.WriteContainerdTLSHosts for the HTTPS listener).
func (n *RealNode) addRegistry(spec RealNodeSpec) error {
	addrs := []string{spec.Registry}
	if spec.RegistryTLS != "" {
		addrs = append(addrs, spec.RegistryTLS)
	}
	for _, addr := range addrs {
		host, p, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			return fmt.Errorf("node registry %q: want 127.0.0.1:port", addr)
		}
		if _, err := strconv.Atoi(p); err != nil {
			return fmt.Errorf("node registry %q: %w", addr, err)
		}
	}
	mirrors := spec.Mirrors
	if len(mirrors) == 0 {
		mirrors = ociimage.MirroredRegistries
	}
	for _, addr := range addrs {
		if err := n.net.relay(addr, addr); err != nil {
			return err
		}
	}
	dir := filepath.Join(n.Dir, "containerd", "certs.d")
	if err := ociimage.WriteContainerdHosts(dir, spec.Registry, mirrors); err != nil {
		return err
	}
	if spec.RegistryTLS == "" {
		return nil
	}
	if spec.RegistryCA == "" {
		return fmt.Errorf("node registry %s: RegistryTLS without RegistryCA", spec.RegistryTLS)
	}
	return ociimage.WriteContainerdTLSHosts(dir, spec.RegistryTLS, spec.RegistryCA)
}

func writeFiles(files map[string]string) error {
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// TaskPID is the host pid of a container's task (its ID without the
// containerd:// prefix of a pod's containerID), from containerd.
func (n *RealNode) TaskPID(ctx context.Context, id string) (int, error) {
	out, err := n.ctr(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("no task %s on node %s", id, n.Name)
}
