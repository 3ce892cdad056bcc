package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/hack/ociimage"
)

// RealNodeSpec is a node run by a real kubelet.
type RealNodeSpec struct {
	// Name is the node's name (and the kubelet's --hostname-override).
	Name string
	// Labels are the kubelet's --node-labels (NodeRestriction refuses
	// kubernetes.io and k8s.io labels other than its allowed ones).
	Labels map[string]string
	// Taints are registered with the node (registerWithTaints).
	Taints []corev1.Taint
	// Registry is the host:port of a plain-HTTP registry on the host's
	// 127.0.0.1 (ociimage.StartRegistry's Addr); empty for none. containerd
	// reaches it through a relay into the node's namespace and resolves
	// the Mirrors' images there as ociimage.Push stores them
	// (ociimage.ContainerdHosts); any other registry resolves to an empty
	// prefix of it, so no pull leaves the machine.
	Registry string
	// Mirrors are the registry host names whose images come from Registry
	// (e.g. "registry.hookwright.local"); ociimage.MirroredRegistries when
	// empty.
	Mirrors []string
	// RegistryTLS is the HTTPS listener of the same registry
	// (ociimage.Registry.TLSAddr), empty for none: it is relayed into the
	// node's namespace too, and containerd pulls images named after it
	// from it, verifying its certificate against RegistryCA
	// (ociimage.WriteContainerdTLSHosts).
	RegistryTLS string
	// RegistryCA is the registry's CA file (ociimage.TLSFiles.CA), an
	// absolute path; required with RegistryTLS.
	RegistryCA string
	// Kubelet adds to the KubeletConfiguration.
	Kubelet KubeletOptions
}

// KubeletOptions are KubeletConfiguration fields a test may set.
type KubeletOptions struct {
	// CPUManagerPolicy is cpuManagerPolicy: "" (none) or "static", which
	// gives Guaranteed pods with integer cpu requests exclusive CPUs and
	// needs a cpu reservation (KubeReservedCPU).
	CPUManagerPolicy string
	// KubeReservedCPU is kubeReserved cpu, e.g. "500m": allocatable cpu is
	// capacity minus it; the static policy reserves that many whole CPUs
	// (rounded up) for the shared pool.
	KubeReservedCPU string
	// NodeStatusUpdateFrequency is nodeStatusUpdateFrequency: how often
	// the kubelet computes its node status and patches it when it changed
	// (0: the kubelet's 10 s). nodeStatusReportFrequency stays 5 min, as
	// in a default cluster, so an unchanged status is still not patched.
	NodeStatusUpdateFrequency time.Duration
	// NodeLeaseDurationSeconds is nodeLeaseDurationSeconds (0: 40); the
	// kubelet renews its node Lease every quarter of it.
	NodeLeaseDurationSeconds int32
	// MaxContainerRestartPeriod is crashLoopBackOff.maxContainerRestartPeriod
	// (KEP-4603, beta and on by default since 1.35): the longest wait before
	// the kubelet restarts a crashed container, and the first wait too when
	// shorter than its 10 s (pkg/kubelet/kubelet.go, newCrashLoopBackOff).
	// 0: the kubelet's 5 min.
	MaxContainerRestartPeriod time.Duration
	// SyncFrequency is syncFrequency: the period of the kubelet's pod sync
	// loop, which also re-reads mounted Secret and ConfigMap volumes
	// (pkg/kubelet/kubelet.go syncLoop; a pod's resync is jittered up to
	// +50 %, pkg/kubelet/pod_workers.go). 0: the kubelet's 1 min.
	SyncFrequency time.Duration
}

// The real-node suites' heartbeat periods (test/node, test/usage): node
// status every 4 s and the node Lease renewed every 4 s (16 s duration),
// rather than the kubelet's 10 s each. They count the kubelet's reports and
// renewals, and waiting for them was most of their time. The 5 min report
// period, which the oversell server's heartbeat handling rests on, stays.
const (
	TestNodeStatusUpdateFrequency       = 4 * time.Second
	TestNodeLeaseDurationSeconds  int32 = 16
)

// StatusUpdateEvery is the kubelet's node status period under k.
func (k KubeletOptions) StatusUpdateEvery() time.Duration {
	if k.NodeStatusUpdateFrequency > 0 {
		return k.NodeStatusUpdateFrequency
	}
	return 10 * time.Second
}

// LeaseRenewEvery is the kubelet's node Lease renewal period under k: a
// quarter of nodeLeaseDurationSeconds (pkg/kubelet/kubelet.go,
// nodeLeaseRenewIntervalFraction).
func (k KubeletOptions) LeaseRenewEvery() time.Duration {
	d := k.NodeLeaseDurationSeconds
	if d == 0 {
		d = 40
	}
	return time.Duration(d) * time.Second / 4
}

// RealNode is a node run by kubelet v1.37.2 with containerd 2, runc and the
// CNI bridge, in a network namespace of its own (see node_net.go), with
// kube-proxy (iptables mode) for Services. The kubelet authenticates with a
// client certificate for system:node:<name> in system:nodes from the API
// server's client CA, so the Node authorizer and NodeRestriction apply as in
// a cluster; kube-proxy is system:kube-proxy (RBAC's system:node-proxier).
//
// What it takes from the host: root, Debian's runc, iptables and iproute2,
// nsenter, cgroup v1 hierarchies (the kubelet runs with failCgroupV1 false
// and cgroupDriver cgroupfs) and bin/ from hack/tools.sh. Every pod cgroup is
// under /<hierarchy>/hwnode-<slot>/ (the kubelet's cgroupRoot).
//
// Stop removes everything the node made; Leaks lists what is left.
type RealNode struct {
	// Name is the Node object's name.
	Name string
	// Dir holds the node's state (containerd, kubelet, CNI, logs).
	Dir string
	// IP is the node's InternalIP (its end of the host veth).
	IP string
	// PodSubnet is the node's pod range (a /24); pod IPs in it are routed
	// from the host, so a test reaches them directly.
	PodSubnet string
	// StartedToReady is the time from starting containerd to the Node's
	// Ready condition.
	StartedToReady time.Duration
	// Images are what the node imported before its kubelet started:
	// ociimage.PauseName (the sandbox) and ociimage.StandinName. Pods use
	// them under these names with imagePullPolicy Never.
	Images []ociimage.Named

	c     *Cluster
	spec  RealNodeSpec
	net   *nodeNet
	procs map[string]*Process
	// containerIDs are the containers killTasks found (their CNI cache
	// entries are removed with the node's).
	containerIDs []string
	stopped      bool
	leaks        []string
}

// RealNodeRepoRoot is RepoRoot for a package whose tests start a real
// node: it also checks RealNodePrerequisites in the repository's bin/, so
// that a missing one fails the package at once, named: there is no
// fallback.
func RealNodeRepoRoot() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return root, RealNodePrerequisites(filepath.Join(root, "bin"))
}

// RealNodePrerequisites checks what a real node needs and names every
// missing piece. A test (or the demo) that wants a real node fails with
// this error: nothing plays a kubelet in its place.
func RealNodePrerequisites(bin string) error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (the kubelet, containerd and the node's network need it)")
	}
	for _, p := range []struct{ path, what string }{
		{runcPath, "runc (Debian package runc)"},
	} {
		if _, err := os.Stat(p.path); err != nil {
			missing = append(missing, p.what)
		}
	}
	for _, t := range []struct{ name, what string }{
		{"iptables", "iptables (Debian package iptables)"},
		{"iptables-restore", "iptables-restore (Debian package iptables)"},
		{"ip", "ip (Debian package iproute2)"},
		{"nsenter", "nsenter (Debian package util-linux)"},
	} {
		if _, err := exec.LookPath(t.name); err != nil {
			missing = append(missing, t.what)
		}
	}
	for _, b := range []string{"k8s/kubelet", "k8s/kube-proxy", "node/containerd", "node/containerd-shim-runc-v2", "node/ctr", "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			missing = append(missing, "bin/"+b+" (make tools)")
		}
	}
	for _, h := range cgroupHierarchies() {
		if h == "" {
			missing = append(missing, "cgroup hierarchies under /sys/fs/cgroup")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a real node needs: %s", strings.Join(missing, "; "))
	}
	return nil
}

// StartRealNode starts a real node and waits until it is Ready and
// kube-proxy has written its rules. The cluster needs ControllerManager
// (EndpointSlices for kube-proxy, service accounts) and usually Scheduler.
// Cluster.Stop stops the node first.
func (c *Cluster) StartRealNode(ctx context.Context, spec RealNodeSpec) (n *RealNode, err error) {
	if err := RealNodePrerequisites(c.Bin); err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	nn, err := allocNodeSlot(c.opts.Logf)
	if err != nil {
		return nil, err
	}
	n = &RealNode{
		Name: spec.Name, c: c, spec: spec, net: nn, procs: map[string]*Process{},
		Dir: filepath.Join(c.Dir, nn.netns()), IP: nn.nodeIP(), PodSubnet: nn.podSubnet(),
	}
	if err := nn.record(n.Dir, c.ServiceCIDR()); err != nil {
		_ = nn.teardown()
		return nil, err
	}
	c.nodesMu.Lock()
	c.nodes = append(c.nodes, n)
	c.nodesMu.Unlock()
	defer func() {
		if err != nil {
			if serr := n.Stop(context.Background()); serr != nil {
				err = errors.Join(err, fmt.Errorf("clean up the failed node: %w", serr))
			}
		}
	}()
	start := time.Now()
	c.opts.Logf("cluster: starting real node %s (slot %d, pods %s)", spec.Name, nn.slot, nn.podSubnet())
	for _, d := range []string{"logs", "containerd/certs.d", "cni/net.d", "kubelet", "pod-logs", "volume-plugins"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return n, err
		}
	}
	if err := nn.setup(c.ServiceCIDR()); err != nil {
		return n, err
	}
	apiURL, err := url.Parse(c.Config.Host)
	if err != nil {
		return n, err
	}
	apiPort, err := strconv.Atoi(apiURL.Port())
	if err != nil {
		return n, fmt.Errorf("API server port of %s: %w", c.Config.Host, err)
	}
	if err := nn.relay(fmt.Sprintf("127.0.0.1:%d", apiPort), fmt.Sprintf("127.0.0.1:%d", apiPort)); err != nil {
		return n, err
	}
	// The kubernetes Service's endpoint (incluster.go).
	if err := nn.relay(fmt.Sprintf("%s:%d", APIRelayIP, apiRelayPort), fmt.Sprintf("127.0.0.1:%d", apiPort)); err != nil {
		return n, err
	}
	if spec.Registry != "" {
		if err := n.addRegistry(spec); err != nil {
			return n, err
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return n, err
	}
	if err := n.startContainerd(ctx, root); err != nil {
		return n, err
	}
	if err := saveNodeSysctls(); err != nil {
		return n, err
	}
	if err := n.startKubelet(ctx); err != nil {
		return n, err
	}
	if err := WaitFor(ctx, 3*time.Minute, "real node "+spec.Name+" Ready", func(ctx context.Context) (bool, error) {
		if err := n.procs["kubelet"].exitErr(3000); err != nil {
			return false, err
		}
		ready, err := c.NodeReady(ctx, spec.Name)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return ready, err
	}); err != nil {
		return n, err
	}
	n.StartedToReady = time.Since(start)
	if err := n.startKubeProxy(ctx); err != nil {
		return n, err
	}
	c.opts.Logf("cluster: real node %s Ready in %s (kube-proxy up after %s)", spec.Name,
		n.StartedToReady.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	return n, nil
}

// Netns is the name of the node's network namespace (hwnode-<slot>, for
// `ip netns exec`).
func (n *RealNode) Netns() string { return n.net.netns() }

// ContainerdSocket is the node's containerd socket (for ctr or crictl:
// `bin/node/ctr --address <it> -n k8s.io containers ls`).
func (n *RealNode) ContainerdSocket() string { return n.containerdSocket() }

func (n *RealNode) containerdSocket() string {
	return filepath.Join(n.Dir, "containerd", "containerd.sock")
}
func (n *RealNode) cgroupRoot() string { return "/" + n.net.netns() }

// nsenter runs bin in the node's network namespace (only: the mount
// namespace stays the host's, so the kubelet's volume mounts are
// containerd's too).
func (n *RealNode) start(name, bin string, args []string) (*Process, error) {
	full := append([]string{"--net=" + n.net.netnsPath(), "--", bin}, args...)
	env := []string{"PATH=" + filepath.Join(n.c.Bin, "node") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	p, err := StartProcess(name, filepath.Join(n.Dir, "logs"), "nsenter", full, env)
	if err != nil {
		return nil, err
	}
	n.procs[name] = p
	return p, nil
}

// Exec runs a command in the node's network namespace and returns its
// combined output (e.g. iptables-save, ip route).
func (n *RealNode) Exec(ctx context.Context, name string, args ...string) (string, error) {
	full := append([]string{"--net=" + n.net.netnsPath(), "--", name}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %v: %s", name, strings.Join(args, " "), n.net.netns(), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Log returns the path of a component's log ("containerd", "kubelet",
// "kube-proxy").
func (n *RealNode) Log(component string) string {
	return filepath.Join(n.Dir, "logs", component+".log")
}

// Stop removes the node, in this order: cordon and delete its pods (the
// kubelet stops their containers and tears down their network), stop
// kube-proxy and the kubelet, kill and delete what containerd still runs,
// stop containerd, kill what is left in the node's cgroups, remove the
// cgroups, unmount everything under Dir, delete the network, the CNI cache
// entries and the kubelet's /var/log/containers links, restore the kernel
// settings the kubelet changed, and delete the Node. It then records what is
// still there (Leaks). It is safe to call twice.
func (n *RealNode) Stop(ctx context.Context) error {
	if n.c != nil {
		n.c.nodesMu.Lock()
	}
	was := n.stopped
	n.stopped = true
	if n.c != nil {
		n.c.nodesMu.Unlock()
	}
	if was {
		return nil
	}
	var errs []error
	if k := n.procs["kubelet"]; k != nil && n.c.Clientset != nil {
		if done, _ := k.Exited(); !done {
			if err := n.drain(ctx); err != nil {
				n.c.opts.Logf("cluster: node %s: %v (containers are killed through containerd)", n.Name, err)
			}
		}
	}
	for _, name := range []string{"kube-proxy", "kubelet"} {
		if p := n.procs[name]; p != nil {
			_ = p.Stop(15 * time.Second)
		}
	}
	if p := n.procs["containerd"]; p != nil {
		if done, _ := p.Exited(); !done {
			kctx, cancel := context.WithTimeout(ctx, time.Minute)
			if err := n.killTasks(kctx); err != nil {
				errs = append(errs, fmt.Errorf("kill tasks: %w", err))
			}
			cancel()
		}
		_ = p.Stop(15 * time.Second)
	}
	errs = append(errs, n.removeMachineState())
	if n.c.Clientset != nil {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := n.c.Clientset.CoreV1().Nodes().Delete(dctx, n.Name, metav1.DeleteOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			n.c.opts.Logf("cluster: delete node %s: %v", n.Name, err)
		}
	}
	n.leaks = n.findLeaks()
	return errors.Join(errs...)
}

// removeMachineState kills what is left in the node's cgroups, removes
// them, unmounts everything under Dir, deletes the network, the host files
// and Dir, and restores the kernel settings when no other node runs.
func (n *RealNode) removeMachineState() error {
	var errs []error
	if err := n.killLeftoverProcesses(); err != nil {
		errs = append(errs, err)
	}
	if err := n.removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(n.Dir); err != nil {
		errs = append(errs, err)
	}
	n.removeHostFiles()
	// Never remove files through a mount that is still there (a hostPath
	// volume would take host files with it).
	if len(mountsUnder(n.Dir)) == 0 {
		if err := os.RemoveAll(n.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := n.net.teardown(); err != nil {
		errs = append(errs, err)
	}
	if err := restoreNodeSysctls(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// drain cordons the node and deletes its pods gracefully, waiting until the
// kubelet has confirmed every deletion.
func (n *RealNode) drain(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cs := n.c.Clientset
	if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cordon: %w", err)
	}
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name}
	pods, err := cs.CoreV1().Pods("").List(ctx, sel)
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](2)})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return WaitFor(ctx, 80*time.Second, "pods of "+n.Name+" deleted by its kubelet", func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods("").List(ctx, sel)
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 0, nil
	})
}

// Leaks lists what of the node was still on the machine after Stop
// (processes, cgroups, mounts, network namespace, links, routes, CNI and
// log files); empty when Stop cleaned up everything or Stop was not called.
func (n *RealNode) Leaks() []string { return n.leaks }
