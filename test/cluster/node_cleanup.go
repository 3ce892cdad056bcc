package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupHierarchies are the mounted cgroup hierarchies (every v1 one and the
// unified one), as directories.
func cgroupHierarchies() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{""}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// ... mountpoint(4) ... "-" fstype source options
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				out = append(out, unescapeMount(fields[4]))
			}
		}
	}
	if len(out) == 0 {
		return []string{""}
	}
	sort.Strings(out)
	return out
}

// makeCgroupRoot creates the kubelet's cgroupRoot in every hierarchy (the
// kubelet requires it to exist); a cpuset cgroup needs cpus and mems before
// it can hold anything.
func (n *RealNode) makeCgroupRoot() error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, n.cgroupRoot())
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s/%s: %w", d, f, err)
			}
		}
		// The node's pods weigh as much as its CPUs against the host's
		// processes (each thread of which weighs 1024), as kubepods does
		// inside it (cpu.shares = 1024 × allocatable CPUs): with the
		// default 1024 a busy pod got half the CPU the same server got as
		// a plain process on this shared machine.
		if _, err := os.Stat(filepath.Join(d, "cpu.shares")); err == nil {
			if err := os.WriteFile(filepath.Join(d, "cpu.shares"), []byte(strconv.Itoa(1024*runtime.NumCPU())), 0o644); err != nil {
				return fmt.Errorf("cgroup %s/cpu.shares: %w", d, err)
			}
		}
	}
	return nil
}

// nodeCgroupDirs lists the node's cgroup directories, deepest first.
func (n *RealNode) nodeCgroupDirs() []string {
	var dirs []string
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, n.cgroupRoot())
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// killLeftoverProcesses SIGKILLs every process in the node's cgroups or
// whose command line names the node's directory (a shim containerd lost).
func (n *RealNode) killLeftoverProcesses() error {
	var pids []int
	// The deadline is for a loaded machine, where the kernel takes its
	// time to end processes; the wait ends as soon as they are gone.
	if _, err := Poll(context.Background(), 100*time.Millisecond, time.Minute, "processes of node "+n.Name+" gone", func(context.Context) (bool, error) {
		pids = n.processes()
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(pids) == 0, nil
	}); err != nil {
		return fmt.Errorf("processes of node %s survive SIGKILL: %v", n.Name, pids)
	}
	return nil
}

// processes are the pids in the node's cgroups or naming its directory.
func (n *RealNode) processes() []int {
	self := os.Getpid()
	seen := map[int]bool{}
	for _, d := range n.nodeCgroupDirs() {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != self {
				seen[pid] = true
			}
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), n.Dir+"/") {
			seen[pid] = true
		}
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// removeCgroups removes the node's cgroups (the kubelet leaves kubepods and
// its QoS and pod cgroups in every hierarchy), deepest first.
func (n *RealNode) removeCgroups() error {
	var last error
	// A loaded machine's kernel takes its time to release them; the wait
	// ends as soon as they are removed.
	if _, err := Poll(context.Background(), 100*time.Millisecond, 30*time.Second, "cgroups of node "+n.Name+" removed", func(context.Context) (bool, error) {
		last = nil
		for _, d := range n.nodeCgroupDirs() {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				last = fmt.Errorf("rmdir %s: %w", d, err)
			}
		}
		return last == nil, nil
	}); err != nil {
		return last
	}
	return nil
}

// mountsUnder lists mount points at or under dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or under dir (volume tmpfs, the
// kubelet's shared bind mount of its root, pinned pod network namespaces).
func unmountUnder(dir string) error {
	var errs []error
	for i := 0; i < 5; i++ {
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			return nil
		}
		errs = nil
		for _, mp := range mps {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
			}
		}
	}
	if mps := mountsUnder(dir); len(mps) > 0 {
		errs = append(errs, fmt.Errorf("still mounted: %v", mps))
	}
	return errors.Join(errs...)
}

// cniResultsDir is libcni's cache, which containerd cannot move.
const cniResultsDir = "/var/lib/cni/results"

// containerLogLinks is where the kubelet links container logs, always.
const containerLogLinks = "/var/log/containers"

// removeHostFiles deletes what the node left outside Dir: its CNI cache
// entries and the kubelet's container log links into Dir.
func (n *RealNode) removeHostFiles() {
	for _, p := range n.hostFiles() {
		_ = os.Remove(p)
	}
}

func (n *RealNode) hostFiles() []string {
	var out []string
	// Sandbox IDs from containerd's CRI state too: a run that was killed
	// never listed them (killTasks).
	if es, err := os.ReadDir(filepath.Join(n.Dir, "containerd", "root", "io.containerd.grpc.v1.cri", "sandboxes")); err == nil {
		for _, e := range es {
			if !slices.Contains(n.containerIDs, e.Name()) {
				n.containerIDs = append(n.containerIDs, e.Name())
			}
		}
	}
	if es, err := os.ReadDir(cniResultsDir); err == nil {
		for _, e := range es {
			mine := strings.HasPrefix(e.Name(), n.net.netns()+"-")
			for _, id := range n.containerIDs {
				mine = mine || strings.Contains(e.Name(), "-"+id+"-")
			}
			if mine {
				out = append(out, filepath.Join(cniResultsDir, e.Name()))
			}
		}
	}
	if es, err := os.ReadDir(containerLogLinks); err == nil {
		for _, e := range es {
			p := filepath.Join(containerLogLinks, e.Name())
			if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, n.Dir+"/") {
				out = append(out, p)
			}
		}
	}
	return out
}

// findLeaks lists what of the node is still on the machine.
func (n *RealNode) findLeaks() []string {
	var out []string
	for _, pid := range n.processes() {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("process %d (%s)", pid, strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")))
	}
	for _, d := range n.nodeCgroupDirs() {
		out = append(out, "cgroup "+d)
	}
	for _, mp := range mountsUnder(n.Dir) {
		out = append(out, "mount "+mp)
	}
	out = append(out, n.net.leaks()...)
	for _, f := range n.hostFiles() {
		out = append(out, "file "+f)
	}
	return out
}

// HostPacketFilterLeaks lists kube-proxy's and CNI's chains and tables in
// the host's own network namespace. A real node keeps them in its own
// namespace, so any here is a bug (or another kube-proxy on the machine).
func HostPacketFilterLeaks() []string {
	var out []string
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		b, err := exec.Command(tool).Output()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, ":KUBE-") || strings.HasPrefix(l, ":CNI-") {
				out = append(out, tool+": chain "+strings.Fields(l)[0][1:])
			}
		}
	}
	if b, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "kube-proxy") || strings.Contains(l, "cni_plugins") {
				out = append(out, "nft: "+strings.TrimSpace(l))
			}
		}
	}
	return out
}

// The kubelet sets these kernel settings when they differ from what it wants
// (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables; with
// protectKernelDefaults it refuses to start instead). They are not per
// namespace, so the first real node on the machine saves them and the last
// one to stop puts them back.
var nodeSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

func sysctlSavePath() string { return filepath.Join(nodeStateDir, "sysctl.saved") }

func withSysctlLock(fn func() error) error {
	if err := os.MkdirAll(nodeStateDir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(nodeStateDir, "sysctl.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	return fn()
}

// saveNodeSysctls records the settings unless a live node already did.
func saveNodeSysctls() error {
	return withSysctlLock(func() error {
		if _, err := os.Stat(sysctlSavePath()); err == nil {
			return nil
		}
		var b strings.Builder
		for _, k := range nodeSysctls {
			v, err := os.ReadFile("/proc/sys/" + k)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "%s=%s\n", k, strings.TrimSpace(string(v)))
		}
		return os.WriteFile(sysctlSavePath(), []byte(b.String()), 0o644)
	})
}

// restoreNodeSysctls puts the saved settings back when no other node's
// slot is held (the caller has released its own).
func restoreNodeSysctls() error {
	return withSysctlLock(func() error {
		b, err := os.ReadFile(sysctlSavePath())
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if otherNodeSlotsHeld() {
			return nil
		}
		var errs []error
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				continue
			}
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore %s: %w", k, err))
			}
		}
		if err := os.Remove(sysctlSavePath()); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
}

// otherNodeSlotsHeld reports whether any slot lock is held (by a live node
// of this or another process).
func otherNodeSlotsHeld() bool {
	es, _ := os.ReadDir(nodeStateDir)
	for _, e := range es {
		if !strings.HasPrefix(e.Name(), "slot-") {
			continue
		}
		f, err := os.OpenFile(filepath.Join(nodeStateDir, e.Name()), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		f.Close()
		if err != nil {
			return true
		}
	}
	return false
}
