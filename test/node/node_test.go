// Package node runs pods on a real node: kubelet v1.37.2, containerd 2 and
// runc, the CNI bridge and kube-proxy, started by test/cluster in a network
// namespace of its own. It proves the node registers under the Node
// authorizer, a hardened pod really runs with the security context it asks
// for and answers on its pod IP, a Service reaches it through kube-proxy,
// nothing of the node's network reaches off the machine, and Stop leaves
// nothing behind. Then it runs the operator's webhook servers there: the
// oversell ratio the real kubelet admits pods against and its
// re-amplification after an outage, server pod failures surfacing on the
// CR, a server container killed under load, a rollout on the real
// kubelet, no admission dropped while the injector's servers restart, and
// the kubelet's status patches while an oversell replica is frozen
// (zerodrop_test.go, counted from the API server's audit log).
//
// The operator runs in this process, wired as `hookwright manager` wires
// it (cmd/app; controllers only for its scheme, settings and
// condition names: operator_test.go, reamplify_test.go). The webhook
// servers never do: they run only as pods of the operator image on the
// node, as a cluster runs them, so the package imports no webhooks/
// package.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/test/cluster"
)

var (
	env  *cluster.Cluster
	node *cluster.RealNode
	// registryAddr is the host:port (on 127.0.0.1) of the test's registry,
	// where the node's containerd resolves images named registryHost/...
	registryAddr string
	// full is HOOKWRIGHT_SCALE=full (make soak): the load tests run at the
	// size they were written at (more load, a longer freeze); make test
	// runs them smaller, with the same checks.
	full = os.Getenv("HOOKWRIGHT_SCALE") == "full"
)

const (
	nodeName     = "real-node-0"
	registryHost = "registry.hookwright.local"
)

// kubeletOptions shortens the real node's status and Lease periods to the
// suites' 4 s (cluster.TestNodeStatusUpdateFrequency). A killed server container is restarted after at most 5 s rather than
// 10, 20, 40 s on its later kills; a crash loop still shows
// CrashLoopBackOff for those 5 s.
var kubeletOptions = cluster.KubeletOptions{
	NodeStatusUpdateFrequency: cluster.TestNodeStatusUpdateFrequency,
	NodeLeaseDurationSeconds:  cluster.TestNodeLeaseDurationSeconds,
	MaxContainerRestartPeriod: 5 * time.Second,
}

func TestMain(m *testing.M) {
	ctx := context.Background()
	if _, err := cluster.RealNodeRepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// A registry on 127.0.0.1 (go-containerregistry's), the only one the
	// node can pull from.
	reg, err := ociimage.StartRegistry("", nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	registryAddr = reg.Addr
	start := time.Now()
	env, err = cluster.New(ctx, cluster.Options{
		ControllerManager:    true,
		Scheduler:            true,
		ServiceAccountTokens: true,
		// The kubelet's node status patches, counted by TestOversellServerFrozen.
		AuditPolicy: kubeletStatusAudit,
		Logf:        func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start cluster:", err)
		os.Exit(1)
	}
	code := 1
	node, err = env.StartRealNode(ctx, cluster.RealNodeSpec{
		Name: nodeName, Labels: map[string]string{"pool": "real"},
		// registryHost for images a test pushes; the public registries for
		// hack/ociimage's images under their own names (the sample's
		// proxy, nginx), as the demo's registry serves them.
		Registry: registryAddr, Mirrors: append([]string{registryHost}, ociimage.MirroredRegistries...),
		Kubelet: kubeletOptions,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start real node:", err)
	} else {
		fmt.Printf("figure: real node start -> Ready %s (cluster and node up in %s)\n",
			node.StartedToReady.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		code = m.Run()
		stopOperator()
	}
	cluster.RemoveHookwrightBinary()
	// Nothing may outlive Stop: processes, cgroups, mounts, the node's
	// network, CNI and log files, the temp dir.
	if !env.StopChecked(os.Stderr) {
		code = 1
	}
	reg.Close()
	os.Exit(code)
}

// createNS creates a namespace; with ServiceAccountTokens the harness
// returns once its default ServiceAccount exists (pods are refused before).
func createNS(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if _, err := env.CreateNamespace(ctx, name, nil); err != nil {
		t.Fatal(err)
	}
}

func TestNodeRegistersAsItsKubelet(t *testing.T) {
	ctx := cluster.TestContext(t, time.Minute)
	n, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := n.Status.NodeInfo.KubeletVersion; v != "v1.37.2" {
		t.Errorf("kubeletVersion = %q, want v1.37.2", v)
	}
	if v := n.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(v, "containerd://2.") {
		t.Errorf("containerRuntimeVersion = %q, want containerd://2.x", v)
	}
	var internal string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = a.Address
		}
	}
	if internal != node.IP {
		t.Errorf("InternalIP = %q, want %q", internal, node.IP)
	}
	if n.Labels["pool"] != "real" {
		t.Errorf("label pool = %q, want real", n.Labels["pool"])
	}
	if cpu := n.Status.Allocatable.Cpu(); cpu.IsZero() {
		t.Errorf("allocatable cpu is zero: %v", n.Status.Allocatable)
	}

	// The kubelet's own credentials: NodeRestriction lets it change only
	// its own Node, so the Node authorizer and the admission plugin really
	// see system:node:<name>.
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(node.Dir, "kubelet.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "not-" + nodeName}}
	if _, err := kc.CoreV1().Nodes().Create(ctx, other, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("kubelet creating node %s: err = %v, want Forbidden", other.Name, err)
	}
	patch := []byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/probe":"x"}}}`)
	if _, err := kc.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("kubelet setting a node-restriction.kubernetes.io label on its node: err = %v, want Forbidden", err)
	}
}

// readyServingPod is hardenedPod labelled app=name, Ready once its server
// answers /healthz (probed every second).
func readyServingPod(ns, name string) *corev1.Pod {
	p := hardenedPod(ns, name, map[string]string{"app": name})
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
		PeriodSeconds: 1,
	}
	return p
}

// hardenedPod is the security context the operator's pods ask for.
func hardenedPod(ns, name string, labels map[string]string, args ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": nodeName},
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "agent",
				Image:           ociimage.StandinName,
				ImagePullPolicy: corev1.PullNever,
				Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				SecurityContext: &corev1.SecurityContext{
					ReadOnlyRootFilesystem:   ptr.To(true),
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	// Arguments replace the image's `serve` role (its Cmd).
	if len(args) > 0 {
		p.Spec.Containers[0].Args = args
	}
	return p
}

func waitPod(ctx context.Context, t *testing.T, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := cluster.WaitFor(ctx, 3*time.Minute, "pod "+ns+"/"+name+" "+what, func(ctx context.Context) (bool, error) {
		p, err := env.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("%v; pod status: %+v\nkubelet log tail:\n%s", err, last.Status, tail(node.Log("kubelet"), 3000))
	}
	return last
}

func tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}

func TestHardenedPodRunsAndServesOnItsPodIP(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	ns := "hardened"
	createNS(ctx, t, ns)
	pod := readyServingPod(ns, "web")
	created := time.Now()
	if _, err := env.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var scheduled time.Time
	p := waitPod(ctx, t, ns, "web", "Ready", func(p *corev1.Pod) bool {
		if scheduled.IsZero() && p.Spec.NodeName != "" {
			scheduled = time.Now()
		}
		return cluster.PodReady(p)
	})
	ready := time.Now()
	t.Logf("figure: pod created -> scheduled %s, scheduled -> Ready %s", scheduled.Sub(created).Round(time.Millisecond), ready.Sub(scheduled).Round(time.Millisecond))
	if p.Spec.NodeName != nodeName {
		t.Fatalf("pod ran on %q, want %s", p.Spec.NodeName, nodeName)
	}
	ip := net.ParseIP(p.Status.PodIP)
	_, subnet, _ := net.ParseCIDR(node.PodSubnet)
	if ip == nil || !subnet.Contains(ip) {
		t.Fatalf("pod IP %q not in the node's pod subnet %s", p.Status.PodIP, node.PodSubnet)
	}

	// The host routes the node's pod subnet: the test reaches the pod IP.
	body := httpGet(ctx, t, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/")
	if want := "hello from web"; !strings.Contains(body, want) {
		t.Errorf("pod answered %q, want %q", body, want)
	}

	// The container's process, seen from the host: the image's user, no
	// capabilities, a seccomp filter, no new privileges, read-only root.
	cid := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	pid := taskPID(ctx, t, cid)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	for k, want := range map[string]string{
		"Uid":        "65532\t65532\t65532\t65532",
		"Gid":        "65532\t65532\t65532\t65532",
		"CapEff":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"Seccomp":    "2",
		"NoNewPrivs": "1",
	} {
		if fields[k] != want {
			t.Errorf("container process %d: %s = %q, want %q", pid, k, fields[k], want)
		}
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	rootRO := false
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == "/" {
			rootRO = strings.Split(f[5], ",")[0] == "ro"
		}
	}
	if !rootRO {
		t.Errorf("container root file system is not read-only:\n%s", mi)
	}
}

// taskPID is the host pid of a container's task, from containerd.
func taskPID(ctx context.Context, t *testing.T, id string) int {
	t.Helper()
	out, err := node.Exec(ctx, filepath.Join(env.Bin, "node", "ctr"), "--address", filepath.Join(node.Dir, "containerd", "containerd.sock"), "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no task %s in:\n%s", id, out)
	return 0
}

func httpGet(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	var last error
	var body string
	tries := 0
	// 20 tries, 500 ms apart; each request may take its 5 s.
	if _, err := cluster.Poll(ctx, 500*time.Millisecond, 2*time.Minute, "GET "+url, func(ctx context.Context) (bool, error) {
		tries++
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				body = string(b)
				return true, nil
			}
			err = fmt.Errorf("status %d, read error %v", resp.StatusCode, rerr)
		}
		last = err
		if tries == 20 {
			return false, cluster.Permanent(err)
		}
		return false, nil
	}); err != nil {
		t.Fatalf("GET %s: %v", url, last)
	}
	return body
}

func TestServiceReachesPodThroughKubeProxy(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	ns := "svc"
	createNS(ctx, t, ns)
	server := readyServingPod(ns, "server")
	if _, err := env.Clientset.CoreV1().Pods(ns).Create(ctx, server, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "server"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	svc, err := env.Clientset.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, ns, "server", "Ready", cluster.PodReady)

	// kube-proxy wrote the Service's rules in the node's namespace.
	if err := cluster.WaitFor(ctx, time.Minute, "kube-proxy rule for "+svc.Spec.ClusterIP, func(ctx context.Context) (bool, error) {
		out, err := node.Exec(ctx, "iptables-save", "-t", "nat")
		return err == nil && strings.Contains(out, "-d "+svc.Spec.ClusterIP+"/32") && strings.Contains(out, "-j KUBE-SEP-"), err
	}); err != nil {
		t.Fatal(err)
	}

	// Another pod reaches the server through the ClusterIP (DNAT by
	// kube-proxy in the node's namespace, back over the same bridge).
	client := hardenedPod(ns, "client", nil, "get", "http://"+svc.Spec.ClusterIP+"/", "hello from server")
	client.Spec.RestartPolicy = corev1.RestartPolicyNever
	client.Spec.Containers[0].Ports = nil
	if _, err := env.Clientset.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(ctx, t, ns, "client", "finished", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	if p.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("client pod %s: %+v\nits log:\n%s", p.Status.Phase, p.Status.ContainerStatuses, podLog(ctx, p))
	}
}

// podLog reads a container's log files on the node (what is left when a
// failure may lie on the way to the kubelet).
func podLog(_ context.Context, p *corev1.Pod) string {
	dir := filepath.Join(node.Dir, "pod-logs", p.Namespace+"_"+p.Name+"_"+string(p.UID))
	var b strings.Builder
	_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			data, _ := os.ReadFile(path)
			fmt.Fprintf(&b, "%s:\n%s\n", path, data)
		}
		return nil
	})
	return b.String()
}

// Nothing the node's network holds leads off the machine: the node's
// namespace has no default route, and a Service address kube-proxy has no
// rule for is unreachable on the host too. Only route look-ups and a local
// connect are made; no packet is sent anywhere.
func TestNodeNetworkStaysOnTheMachine(t *testing.T) {
	ctx := cluster.TestContext(t, time.Minute)
	// 192.0.2.1 (TEST-NET-1) stands for any address outside the machine.
	for _, dst := range []string{"192.0.2.1", "10.248.250.9", "10.0.0.250"} {
		out, err := node.Exec(ctx, "ip", "route", "get", dst)
		if err == nil {
			t.Errorf("node namespace has a route to %s: %s", dst, out)
		}
	}
	routes, err := node.Exec(ctx, "ip", "route", "show")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(routes, "default") {
		t.Errorf("node namespace has a default route:\n%s", routes)
	}
	// A ClusterIP no Service has, dialled from the host: the host's
	// unreachable route refuses it locally.
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", "10.0.0.250:80")
	if err == nil {
		conn.Close()
		t.Fatal("dial 10.0.0.250:80 from the host succeeded")
	}
	if !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("dial 10.0.0.250:80 from the host: %v, want no route to host", err)
	}
	// The pods' masquerade is off: no NAT rule but kube-proxy's.
	nat, err := node.Exec(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(nat, "\n") {
		if strings.Contains(l, "MASQUERADE") && !strings.HasPrefix(l, "-A KUBE-POSTROUTING") {
			t.Errorf("masquerade rule outside kube-proxy's marked traffic: %s", l)
		}
	}
}

// An image the node does not have is pulled from the registry its
// containerd is configured for (hosts.toml, relayed to 127.0.0.1), with
// imagePullPolicy IfNotPresent.
func TestPodPullsFromTheLocalRegistry(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	// Not the imported image's config: a kubelet that pulled an image ID
	// under one name refuses it under a name it never pulled when the pod
	// says imagePullPolicy Never (KubeletEnsureSecretPulledImages, KEP-2535:
	// pkg/kubelet/images/image_manager.go, MustAttemptImagePull), so the
	// imported ociimage.StandinName would turn ErrImageNeverPull. The same
	// image with its port spelled out in Cmd is another image ID.
	img, err := pullableStandin(t)
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.Push(ctx, registryAddr, ociimage.Named{Name: registryHost + "/standin:pulled", Image: img}); err != nil {
		t.Fatal(err)
	}
	ns := "pull"
	createNS(ctx, t, ns)
	pod := hardenedPod(ns, "pulled", nil)
	pod.Spec.Containers[0].Image = registryHost + "/standin:pulled"
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	if _, err := env.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(ctx, t, ns, "pulled", "Ready", func(p *corev1.Pod) bool {
		return cluster.PodReady(p) || p.Status.Phase == corev1.PodRunning
	})
	body := httpGet(ctx, t, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/")
	if !strings.Contains(body, "hello from pulled") {
		t.Errorf("pulled pod answered %q", body)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if id := p.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(id, digest.String()) {
		t.Errorf("imageID %q, want the pushed digest %s", id, digest)
	}
}

// pullableStandin is the node's imported ociimage.StandinName with Cmd
// "serve --port=8080": the same program and port under another image ID.
func pullableStandin(t *testing.T) (v1.Image, error) {
	t.Helper()
	for _, n := range node.Images {
		if n.Name != ociimage.StandinName {
			continue
		}
		cfg, err := n.Image.ConfigFile()
		if err != nil {
			return nil, err
		}
		c := cfg.Config
		c.Cmd = []string{"serve", "--port=8080"}
		return mutate.Config(n.Image, c)
	}
	return nil, fmt.Errorf("the node imported no %s (it has %v)", ociimage.StandinName, node.Images)
}
