// Package cluster starts a real local Kubernetes control plane for tests and
// the demo: etcd and kube-apiserver (through controller-runtime's envtest),
// optionally kube-controller-manager, kube-scheduler, kwok with simulated
// nodes and real nodes (kubelet, containerd, runc, CNI, kube-proxy), all
// built from source by hack/tools.sh into bin/.
//
// The API server sends its "cluster" egress (webhook calls, service proxy,
// kubelet connections) through an HTTP CONNECT proxy on a unix socket
// (EgressSelectorConfiguration, KEP-1281), which maps a Service's
// ClusterIP:port to a local process or, with a real node, dials the
// ClusterIP from inside the node's namespace (kube-proxy picks the pod) and
// pod and node IPs from the host. TLS stays end to end, so a webhook's
// caBundle and its serving certificate's SANs are checked for real. Pods on
// a real node reach the API server through the kubernetes Service with
// in-cluster config.
//
// Each file answers one question:
//
//   - cluster.go: how does the control plane start and stop (Options, New,
//     Stop, Leaks, StopChecked), where does the API server's audit log go
//     (Options.AuditPolicy, AuditLogPath), and how does `make test-unit`
//     keep it from starting (NoControlPlaneEnv, RequireControlPlane)?
//   - version.go: which Kubernetes minor does the API server run
//     (KubeVersionEnv, KubeMinor, MinorAtLeast; make test-compat)?
//   - components.go: how are kube-controller-manager and kube-scheduler
//     started and awaited?
//   - clients.go: how does a test act on the cluster: as whom (Impersonate,
//     KubeletConfig), in which namespace (CreateNamespace), hearing which
//     warnings (Warnings, WarningsClient)?
//   - egress.go: how does the API server's egress leave it (the CONNECT
//     proxy and its EgressSelectorConfiguration)?
//   - routes.go: where does that egress go (ExposeLocal and RouteService to
//     a local server, ClusterIPs, pod and node IPs of real nodes, ErrNoRoute
//     for anything else)?
//   - incluster.go: how does a pod on a real node reach the API server (the
//     kubernetes Service's endpoint)?
//   - pki.go: which certificates do the API server and the kubelets use?
//   - kwok.go: how are simulated nodes made (NodeSpec, AddNode, NodeReady)?
//   - heartbeat.go: how are a kubelet's status loop and node Lease played
//     without a kubelet (Heartbeater)?
//   - metrics.go: how is metrics.k8s.io served (metrics-server through the
//     aggregation layer, kwok's emulated kubelet metrics, SetPodUsage,
//     StopMetricsServer)?
//   - node.go: how does a real node start and stop (RealNodeSpec,
//     StartRealNode, RealNode.Stop), and what must the machine have
//     (RealNodePrerequisites, RealNodeRepoRoot)?
//   - node_kubelet.go: how are its kubelet and kube-proxy configured and run?
//   - node_containerd.go: how are its containerd, CNI and images set up?
//   - node_net.go: where does its network live, and why can no pod or
//     Service address leave the machine?
//   - node_cleanup.go: what can a node leave on the machine, and how is it
//     removed and found (cgroups, mounts, host files, packet filter rules,
//     kernel settings)?
//   - cutproxy.go: how is one client's traffic with the API server faulted
//     at a point the test knows (CutProxy: hold its connections once the
//     server sent a number of bytes, then close them as a server that
//     went away would)?
//   - process.go: how does the harness run a child process (StartProcess,
//     Settle, its log, a free port) and await its probe server (ProbeOK)?
//   - poll.go: how does a test wait (WaitFor, Poll, During, Every,
//     Permanent, and Watch for what a poll can miss)? Every wait and
//     repeated check in test/... uses these.
//   - oversell.go: what do the suites that oversell nodes share: the
//     webhook configuration for an oversell server a test runs itself
//     (OversellWebhook)?
//   - ratiolog.go: which cpu ratios did a node's target go through, and
//     when by the operator's own stamps (WatchRatios, CheckRatioSteps)?
//   - inprocess.go: what does an operator that a suite runs in its own
//     process report (ReconcileTotal, from controller-runtime's registry;
//     Labelled, its metrics by label)?
//   - pods.go: what does a test read of a pod (PodReady)?
//   - repo.go: what does the harness take from the repository (RepoRoot,
//     the hookwright binary, config/samples: LoadSample, SampleInjector
//     and SetProxyImage, the template change for a new revision)?
//   - certs.go, toywebhook.go, atomicdir.go: fixtures: a test CA and its
//     serving certificates (MustServiceCA: both at once, for a Service), a
//     minimal mutating webhook, and a directory written the kubelet's way
//     (atomic ..data swap).
//
// It must not import controllers or webhooks: the harness runs them only
// as the pods a cluster would run.
package cluster
