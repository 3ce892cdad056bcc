package ociimage

import (
	"fmt"
	"io/fs"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The names our scenarios and manifests use.
const (
	// OperatorName is the Makefile's IMG for VERSION 0.1.0, the image
	// config/manager and the bundle's CSV name.
	OperatorName = "ghcr.io/hookwright/hookwright:v0.1.0"
	// PauseName is containerd v2's default sandbox image
	// (internal/cri/config.DefaultSandboxImage), so a node needs no
	// sandbox_image setting.
	PauseName = "registry.k8s.io/pause:3.10.2"
	// nginxName is the image of the demo's first scenario (docs/demo.md)
	// (`kubectl create deployment test --image=nginx:1.23-alpine`).
	nginxName = "docker.io/library/nginx:1.23-alpine"
	// The sample SidecarInjector's images
	// (config/samples/admission_v1alpha1_sidecarinjector.yaml).
	proxyName      = "ghcr.io/hookwright/proxy:1.4.2"
	proxyInitName  = "ghcr.io/hookwright/proxy-init:1.4.2"
	logShipperName = "ghcr.io/hookwright/log-shipper:0.9.0"
	// proxyNextName is the proxy's next version, the same program under
	// another tag (and image ID, its description names it): what a
	// rollout of the sample's proxy image (spec.rollout) upgrades to.
	proxyNextName = "ghcr.io/hookwright/proxy:1.4.3"
	// StandinName is a plain, hardened workload (test/images/standin's
	// serve role on :8080 as 65532:65532); its get role is an HTTP client.
	// test/cluster's real node imports it for test/node's pods.
	StandinName = "ghcr.io/hookwright/standin:v1"
)

// DefaultCACertificates is where Debian's ca-certificates package keeps
// the bundle distroless/static copies into its image.
const DefaultCACertificates = "/etc/ssl/certs/ca-certificates.crt"

// operatorConfig is the config of the Dockerfile's final stage
// (FROM gcr.io/distroless/static:nonroot; WORKDIR /; USER 65532:65532;
// ENTRYPOINT ["/hookwright"]; CMD ["manager"]) with distroless' Env. The
// Dockerfile sets no LABEL, so Labels stays nil (whatever labels the
// distroless base may carry are not ours to copy);
// TestOperatorImageMatchesDockerfile keeps the two in step.
var operatorConfig = config{
	User:       "65532:65532",
	WorkingDir: "/",
	Entrypoint: []string{"/hookwright"},
	Cmd:        []string{"manager"},
	Env:        []string{defaultPath, "SSL_CERT_FILE=" + DefaultCACertificates},
}

// nonrootBase is what the operator needs of distroless/static:nonroot: the
// users and groups (root, nobody, nonroot 65532), nonroot's home, a sticky
// /tmp and the CA bundle. There is no shell and no other program.
func nonrootBase(caBundle []byte) []file {
	return []file{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
				"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Data: caBundle},
		{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}
}

// operator returns the operator image for linux/arch: the static hookwright
// binary at /hookwright on the nonroot base (one layer for the base, one
// for the binary, as distroless and the Dockerfile's COPY give).
func operator(arch, binary, caCertificates string) (v1.Image, error) {
	bin, err := readExecutable(binary)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(caCertificates)
	if err != nil {
		return nil, fmt.Errorf("ociimage: CA certificates for the operator image: %w (Debian: apt-get install ca-certificates)", err)
	}
	base, err := layer(nonrootBase(ca))
	if err != nil {
		return nil, err
	}
	app, err := layer([]file{{Path: "/hookwright", Mode: 0o755, Data: bin}})
	if err != nil {
		return nil, err
	}
	return newImage(arch, operatorConfig, base, app)
}

// pause returns the sandbox image: test/images/pause at /pause, run as
// 65535 like the upstream image.
func pause(arch, binary string) (v1.Image, error) {
	bin, err := readExecutable(binary)
	if err != nil {
		return nil, err
	}
	l, err := layer([]file{{Path: "/pause", Mode: 0o755, Data: bin}})
	if err != nil {
		return nil, err
	}
	return newImage(arch, config{User: "65535:65535", WorkingDir: "/", Entrypoint: []string{"/pause"}}, l)
}

// standin is one role of test/images/standin and the image that plays it.
type standin struct {
	name, path, user string
	cmd, ports       []string
}

var standins = []standin{
	// nginx:1.23-alpine runs as root (nginx binds :80 itself) with
	// CMD ["nginx", "-g", "daemon off;"].
	{name: nginxName, path: "/usr/sbin/nginx", cmd: []string{"-g", "daemon off;"}, ports: []string{"80/tcp"}},
	// The pod's securityContext sets the proxy's uid (1337); the image
	// agrees, like Istio's proxy image.
	{name: proxyName, path: "/usr/local/bin/proxy", user: "1337:1337", ports: []string{"15000/tcp", "15001/tcp"}},
	{name: proxyNextName, path: "/usr/local/bin/proxy", user: "1337:1337", ports: []string{"15000/tcp", "15001/tcp"}},
	{name: proxyInitName, path: "/usr/local/bin/proxy-init"},
	{name: logShipperName, path: "/usr/local/bin/log-shipper", user: "65532:65532"},
	// Run as "standin", the program takes its role from the first
	// argument, so a pod picks serve or get with args alone.
	{name: StandinName, path: "/usr/local/bin/standin", user: "65532:65532", cmd: []string{"serve"}, ports: []string{"8080/tcp"}},
}

// standinUsers is every stand-in's first layer: the users and groups they
// run as and /tmp. The kubelet hands the runtime only the image's uid
// (pkg/kubelet/kuberuntime/security_context.go, RunAsUser), and the
// runtime takes the gid from the image's /etc/passwd: without these files
// a pod that sets no runAsGroup would run with gid 0.
var standinUsers = []file{
	{Path: "/etc/passwd", Mode: 0o644, Data: []byte(
		"root:x:0:0:root:/root:/sbin/nologin\n" +
			"proxy:x:1337:1337:proxy:/nonexistent:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nproxy:x:1337:\nnonroot:x:65532:\n")},
	{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
}

// Standins returns one image per stand-in role, each holding the one
// test/images/standin binary under the role's name as its entrypoint (the
// program picks its role from argv[0]) on the standinUsers layer.
func standinImages(arch, binary string) ([]Named, error) {
	bin, err := readExecutable(binary)
	if err != nil {
		return nil, err
	}
	users, err := layer(standinUsers)
	if err != nil {
		return nil, err
	}
	var out []Named
	for _, s := range standins {
		l, err := layer([]file{{Path: s.path, Mode: 0o755, Data: bin}})
		if err != nil {
			return nil, err
		}
		img, err := newImage(arch, config{
			User: s.user, WorkingDir: "/", Entrypoint: []string{s.path}, Cmd: s.cmd, ExposedPorts: s.ports,
			Labels: map[string]string{"org.opencontainers.image.description": "hookwright stand-in for " + s.name},
		}, users, l)
		if err != nil {
			return nil, err
		}
		out = append(out, Named{Name: s.name, Image: img})
	}
	return out, nil
}

func readExecutable(p string) ([]byte, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("ociimage: %s is not an executable file", p)
	}
	return os.ReadFile(p)
}
