package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func (n *RealNode) startKubelet(ctx context.Context) error {
	kc, err := n.kubeconfig("kubelet", envtest.User{Name: "system:node:" + n.Name, Groups: []string{"system:nodes"}})
	if err != nil {
		return err
	}
	tlsCert, tlsKey, err := writeKubeletServing(n.c.ca, n.Dir, n.Name, net.ParseIP(n.IP))
	if err != nil {
		return err
	}
	cfg := filepath.Join(n.Dir, "kubelet-config.yaml")
	if err := writeFiles(map[string]string{cfg: n.kubeletConfig(tlsCert, tlsKey)}); err != nil {
		return err
	}
	args := []string{
		"--config=" + cfg,
		"--kubeconfig=" + kc,
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP,
		"--root-dir=" + filepath.Join(n.Dir, "kubelet"),
		"--v=2",
	}
	if len(n.spec.Labels) > 0 {
		keys := make([]string, 0, len(n.spec.Labels))
		for k := range n.spec.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		kv := make([]string, len(keys))
		for i, k := range keys {
			kv[i] = k + "=" + n.spec.Labels[k]
		}
		args = append(args, "--node-labels="+strings.Join(kv, ","))
	}
	_, err = n.start("kubelet", filepath.Join(n.c.Bin, "k8s", "kubelet"), args)
	return err
}

// RestartKubelet stops the kubelet (SIGTERM, as a service manager would)
// and starts it again with the same configuration; pods keep running in
// containerd meanwhile.
func (n *RealNode) RestartKubelet(ctx context.Context) error {
	if p := n.procs["kubelet"]; p != nil {
		_ = p.Stop(30 * time.Second)
	}
	old := filepath.Join(n.Dir, "logs", "kubelet.log")
	_ = os.Rename(old, filepath.Join(n.Dir, "logs", fmt.Sprintf("kubelet-%d.log", time.Now().UnixNano())))
	return n.startKubelet(ctx)
}

// kubeletConfig is the KubeletConfiguration. Beyond what the host needs
// (cgroup v1, cgroupfs, no CAP_SYS_RESOURCE) it keeps every path under Dir,
// gives pods no resolver (resolvConf ""; no cluster DNS runs), never
// garbage-collects images (they cannot be pulled again) and sets eviction
// thresholds low so a full CI disk does not taint the node. It serves
// tlsCert (from the harness CA, which the API server checks with
// --kubelet-certificate-authority) and accepts the API server's client
// certificate (KubeletClientUser) from the same CA, so `kubectl logs` and
// exec work as in a cluster. RealNodeSpec.Kubelet adds the CPU manager
// policy, a cpu reservation, shorter status and Lease periods and a
// shorter crash-loop back-off.
func (n *RealNode) kubeletConfig(tlsCert, tlsKey string) string {
	taints := ""
	for _, t := range n.spec.Taints {
		taints += fmt.Sprintf("- key: %q\n  value: %q\n  effect: %q\n", t.Key, t.Value, t.Effect)
	}
	if taints != "" {
		taints = "registerWithTaints:\n" + taints
	}
	extra := ""
	if k := n.spec.Kubelet; k.CPUManagerPolicy != "" {
		extra += "cpuManagerPolicy: " + k.CPUManagerPolicy + "\n"
	}
	if k := n.spec.Kubelet; k.KubeReservedCPU != "" {
		extra += "kubeReserved:\n  cpu: " + k.KubeReservedCPU + "\n"
	}
	if k := n.spec.Kubelet; k.NodeStatusUpdateFrequency > 0 {
		// Set explicitly, the update period would also become the report
		// period (v1beta1 defaults): keep the default 5 min.
		extra += fmt.Sprintf("nodeStatusUpdateFrequency: %s\nnodeStatusReportFrequency: 5m0s\n", k.NodeStatusUpdateFrequency)
	}
	if k := n.spec.Kubelet; k.MaxContainerRestartPeriod > 0 {
		extra += fmt.Sprintf("crashLoopBackOff:\n  maxContainerRestartPeriod: %s\n", k.MaxContainerRestartPeriod)
	}
	if k := n.spec.Kubelet; k.SyncFrequency > 0 {
		extra += fmt.Sprintf("syncFrequency: %s\n", k.SyncFrequency)
	}
	if k := n.spec.Kubelet; k.NodeLeaseDurationSeconds > 0 {
		extra += fmt.Sprintf("nodeLeaseDurationSeconds: %d\n", k.NodeLeaseDurationSeconds)
	}
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: ` + n.cgroupRoot() + `
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://` + n.containerdSocket() + `
address: ` + n.IP + `
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: ` + tlsCert + `
tlsPrivateKeyFile: ` + tlsKey + `
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ` + filepath.Join(n.c.APIServerCertDir(), pkiCA) + `
authorization:
  mode: Webhook
clusterDomain: cluster.local
resolvConf: ""
failSwapOn: false
podLogsDir: ` + filepath.Join(n.Dir, "pod-logs") + `
volumePluginDir: ` + filepath.Join(n.Dir, "volume-plugins") + `
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
runtimeRequestTimeout: 5m
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
` + taints + extra
}

func (n *RealNode) startKubeProxy(ctx context.Context) error {
	kc, err := n.kubeconfig("kube-proxy", envtest.User{Name: "system:kube-proxy"})
	if err != nil {
		return err
	}
	cfg := filepath.Join(n.Dir, "kube-proxy-config.yaml")
	// conntrack values of 0 leave the kernel's settings alone (the
	// conntrack table size is not per namespace).
	if err := writeFiles(map[string]string{cfg: `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ` + kc + `
hostnameOverride: ` + n.Name + `
mode: iptables
clusterCIDR: ` + nodePodRange + `
bindAddress: ` + n.IP + `
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
nodePortAddresses: ["` + n.IP + `/32"]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
iptables:
  localhostNodePorts: false
  syncPeriod: 30s
  minSyncPeriod: 1s
`}); err != nil {
		return err
	}
	p, err := n.start("kube-proxy", filepath.Join(n.c.Bin, "k8s", "kube-proxy"), []string{"--config=" + cfg, "--v=2"})
	if err != nil {
		return err
	}
	// Ready once its first sync wrote the KUBE-SERVICES chain.
	return WaitFor(ctx, 2*time.Minute, "kube-proxy of "+n.Name+" synced", func(ctx context.Context) (bool, error) {
		if err := p.exitErr(3000); err != nil {
			return false, err
		}
		out, err := n.Exec(ctx, "iptables-save", "-t", "nat")
		return err == nil && strings.Contains(out, "-A KUBE-SERVICES"), err
	})
}

// kubeconfig writes a kubeconfig for user (a client certificate from the API
// server's client CA) and returns its path.
func (n *RealNode) kubeconfig(name string, user envtest.User) (string, error) {
	u, err := n.c.env.AddUser(user, nil)
	if err != nil {
		return "", fmt.Errorf("user %s: %w", user.Name, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.Dir, name+".kubeconfig")
	return path, os.WriteFile(path, b, 0o600)
}
