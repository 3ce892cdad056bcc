package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A real node's network lives in a network namespace of its own, like a
// kind node's container, so nothing it does touches the host's routes or
// packet filter, two nodes (of two test packages running at once) never share
// a bridge or kube-proxy's chains, and deleting the namespace removes them.
//
// Addresses exist only on this machine (none of them is on a host route):
//
//	10.248.<slot>.0/24   the node's pods (CNI bridge hwbr<slot>, gateway .1)
//	10.249.<slot>.0/30   the veth between host (hwh<slot>, .1) and node (eth0, .2)
//
// The node's namespace has no default route: only the bridge, the veth and
// `unreachable` routes for the whole pod range and the Service CIDR, so a
// packet kube-proxy did not translate is dropped there with "no route". The
// host routes the node's pod /24 through the veth (the test reaches pod IPs)
// and has `unreachable` routes for the pod range and the Service CIDR (one per
// node, told apart by metric), so no host packet to them leaves either.
const (
	nodePodRange  = "10.248.0.0/16"
	nodeLinkRange = "10.249.0.0/16"
	// nodeStateDir holds the slot locks and the kernel settings the kubelet
	// changes (see nodeSysctls).
	nodeStateDir = "/run/hookwright-nodes"
	maxNodeSlots = 250
	// nodeRouteMetricBase + slot is the metric of a node's host routes.
	nodeRouteMetricBase = 4000
)

// nodeNet is one node's network: its slot number picks every name and range.
type nodeNet struct {
	slot        int
	lock        *os.File // flock held while the node exists
	serviceCIDR string

	mu      sync.Mutex
	relays  []net.Listener
	wg      sync.WaitGroup
	created bool
}

func (n *nodeNet) netns() string     { return fmt.Sprintf("hwnode-%d", n.slot) }
func (n *nodeNet) netnsPath() string { return "/run/netns/" + n.netns() }
func (n *nodeNet) hostLink() string  { return fmt.Sprintf("hwh%d", n.slot) }
func (n *nodeNet) bridge() string    { return fmt.Sprintf("hwbr%d", n.slot) }
func (n *nodeNet) hostIP() string    { return fmt.Sprintf("10.249.%d.1", n.slot) }
func (n *nodeNet) nodeIP() string    { return fmt.Sprintf("10.249.%d.2", n.slot) }
func (n *nodeNet) podSubnet() string { return fmt.Sprintf("10.248.%d.0/24", n.slot) }
func (n *nodeNet) podGateway() string {
	return fmt.Sprintf("10.248.%d.1", n.slot)
}
func (n *nodeNet) metric() string { return strconv.Itoa(nodeRouteMetricBase + n.slot) }

// allocNodeSlot takes the first slot whose lock is free. A slot whose lock
// is free but whose namespace, link or routes are still there belongs to a
// run that died (a flock ends with its process): its leftovers are removed
// first, from what that run recorded in the lock file.
func allocNodeSlot(logf func(string, ...any)) (*nodeNet, error) {
	if err := os.MkdirAll(nodeStateDir, 0o755); err != nil {
		return nil, err
	}
	for slot := 1; slot <= maxNodeSlots; slot++ {
		f, err := os.OpenFile(filepath.Join(nodeStateDir, fmt.Sprintf("slot-%d.lock", slot)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		n := &nodeNet{slot: slot, lock: f}
		if err := n.reclaim(logf); err != nil {
			logf("cluster: real-node slot %d keeps leftovers of a dead run: %v", slot, err)
			f.Close()
			continue
		}
		return n, nil
	}
	return nil, fmt.Errorf("no free real-node slot in %s (1..%d)", nodeStateDir, maxNodeSlots)
}

// record writes the node's directory and Service CIDR into the slot's lock
// file, for reclaim.
func (n *nodeNet) record(dir, serviceCIDR string) error {
	n.serviceCIDR = serviceCIDR
	if err := n.lock.Truncate(0); err != nil {
		return err
	}
	_, err := n.lock.WriteAt([]byte(dir+"\n"+serviceCIDR+"\n"), 0)
	return err
}

// reclaim removes what a dead run left in this slot, if anything.
func (n *nodeNet) reclaim(logf func(string, ...any)) error {
	b, _ := io.ReadAll(n.lock)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) == 2 && lines[0] != "" {
		n.serviceCIDR = lines[1]
	}
	n.created = true
	stale := &RealNode{Name: n.netns(), net: n}
	if len(lines) == 2 && filepath.IsAbs(lines[0]) {
		stale.Dir = filepath.Clean(lines[0])
	}
	var left []string
	if stale.Dir != "" {
		left = stale.findLeaks()
	} else {
		left = n.leaks()
		for _, d := range stale.nodeCgroupDirs() {
			left = append(left, "cgroup "+d)
		}
	}
	if len(left) == 0 {
		n.created = false
		return nil
	}
	logf("cluster: real-node slot %d: removing leftovers of a dead run: %s", n.slot, strings.Join(left, "; "))
	lock := n.lock
	n.lock = nil // teardown must not release it
	defer func() { n.lock = lock }()
	if stale.Dir == "" {
		stale.Dir = filepath.Join(os.TempDir(), "hw-unknown-"+n.netns())
	}
	if err := stale.removeMachineState(); err != nil {
		return err
	}
	n.created = false
	if rest := append(n.leaks(), stale.findLeaks()...); len(rest) > 0 {
		return fmt.Errorf("still there: %s", strings.Join(rest, "; "))
	}
	return nil
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setup creates the namespace, the veth and the routes.
func (n *nodeNet) setup(serviceCIDR string) error {
	n.serviceCIDR = serviceCIDR
	ns := n.netns()
	n.created = true
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", n.hostLink(), "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"addr", "add", n.hostIP() + "/30", "dev", n.hostLink()},
		{"link", "set", n.hostLink(), "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "addr", "add", APIRelayIP + "/32", "dev", "lo"},
		// Only sockets marked egressMark (dialIn's) may route a ClusterIP,
		// so kube-proxy's OUTPUT rules can translate it; everything else
		// keeps the unreachable route below.
		{"-n", ns, "rule", "add", "fwmark", fmt.Sprintf("%#x", egressMark), "lookup", egressTable, "pref", "100"},
		{"-n", ns, "route", "add", serviceCIDR, "dev", "lo", "src", APIRelayIP, "table", egressTable},
		{"-n", ns, "addr", "add", n.nodeIP() + "/30", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "unreachable", nodePodRange},
		{"-n", ns, "route", "add", "unreachable", serviceCIDR},
		{"route", "add", "unreachable", nodePodRange, "metric", n.metric()},
		{"route", "add", "unreachable", serviceCIDR, "metric", n.metric()},
		{"route", "add", n.podSubnet(), "via", n.nodeIP(), "dev", n.hostLink()},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	// The node forwards between its veth and the bridge; bridged pod traffic
	// goes through iptables so kube-proxy's DNAT is undone for replies
	// between pods on the same bridge.
	return n.inNetns(func() error {
		for k, v := range map[string]string{
			"net/ipv4/ip_forward":                 "1",
			"net/bridge/bridge-nf-call-iptables":  "1",
			"net/bridge/bridge-nf-call-ip6tables": "1",
		} {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return fmt.Errorf("sysctl %s in %s: %w", k, n.netns(), err)
			}
		}
		return nil
	})
}

// inNetns runs fn on an OS thread that has joined the node's namespace.
// The thread is dropped afterwards if it cannot return to the host's.
func (n *nodeNet) inNetns(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer host.Close()
		target, err := os.Open(n.netnsPath())
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", n.netnsPath(), err)
			runtime.UnlockOSThread()
			return
		}
		ferr := fn()
		if err := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); err != nil {
			// Still locked: the runtime ends this thread with the goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("return to host netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// relay makes listen (an address inside the node's namespace) reach host
// (an address of the host): 127.0.0.1:port for the API server and a local
// registry, so the node's kubeconfigs and registry hosts are the host's own
// addresses, and APIRelayIP:443 for the kubernetes Service.
func (n *nodeNet) relay(listen, host string) error {
	var ln net.Listener
	if err := n.inNetns(func() (err error) {
		ln, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		return fmt.Errorf("relay %s into %s: %w", listen, n.netns(), err)
	}
	n.mu.Lock()
	n.relays = append(n.relays, ln)
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				relayConn(c, host)
			}()
		}
	}()
	return nil
}

// egressMark marks dialIn's sockets (SO_MARK; kube-proxy's own marks are
// 0x4000 and 0x8000) and egressTable is the node namespace's routing table
// for them: a local socket's route is looked up before kube-proxy's OUTPUT
// DNAT, so a ClusterIP needs a route there, and the namespace's main table
// has only `unreachable` for the Service CIDR. The table's route goes to lo
// with source APIRelayIP (on lo, inside the pod range, so replies from pods
// come back): a packet no rule translated never leaves the namespace.
const (
	egressMark  = 0x10000000
	egressTable = "100"
)

// dialIn connects to addr from inside the node's namespace with egressMark
// (the socket is made there; its packets pass the node's kube-proxy rules
// as any local client's would).
func (n *nodeNet) dialIn(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, egressMark)
		}); err != nil {
			return err
		}
		return serr
	}}
	var c net.Conn
	err := n.inNetns(func() (err error) {
		c, err = d.Dial("tcp", addr)
		return err
	})
	return c, err
}

func relayConn(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

// teardown removes the relays, the namespace (with the bridge, veths,
// routes and packet filter rules in it), the host link and host routes, and
// releases the slot. Missing pieces are not errors.
func (n *nodeNet) teardown() error {
	n.mu.Lock()
	for _, ln := range n.relays {
		_ = ln.Close()
	}
	n.relays = nil
	n.mu.Unlock()
	var errs []error
	if n.created {
		// Deleting one end of the veth deletes both at once; a namespace
		// itself is freed asynchronously.
		if _, err := net.InterfaceByName(n.hostLink()); err == nil {
			if err := ipCmd("link", "delete", n.hostLink()); err != nil {
				errs = append(errs, err)
			}
		}
		for _, cidr := range []string{nodePodRange, n.serviceCIDR} {
			if cidr == "" {
				continue
			}
			if hostRouteExists("unreachable", cidr, n.metric()) {
				if err := ipCmd("route", "del", "unreachable", cidr, "metric", n.metric()); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if _, err := os.Stat(n.netnsPath()); err == nil {
			if err := ipCmd("netns", "delete", n.netns()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if n.lock != nil {
		_ = n.lock.Close()
		n.lock = nil
	}
	return errors.Join(errs...)
}

// hostRouteExists reports whether `ip route show` lists a route of this type
// to cidr with metric.
func hostRouteExists(typ, cidr, metric string) bool {
	out, err := exec.Command("ip", "route", "show", "type", typ, cidr).Output()
	if err != nil {
		return false
	}
	return strings.Contains(string(out), "metric "+metric)
}

// leaks lists what of this node's network is still on the host.
func (n *nodeNet) leaks() []string {
	var out []string
	if _, err := os.Stat(n.netnsPath()); err == nil {
		out = append(out, "network namespace "+n.netnsPath())
	}
	if _, err := net.InterfaceByName(n.hostLink()); err == nil {
		out = append(out, "link "+n.hostLink())
	}
	if b, err := exec.Command("ip", "route", "show", "table", "all").Output(); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, n.podSubnet()) || strings.Contains(l, n.hostLink()) || strings.Contains(l, "metric "+n.metric()) {
				out = append(out, "route "+strings.TrimSpace(l))
			}
		}
	}
	return out
}
