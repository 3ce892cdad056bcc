package ociimage

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// MirroredRegistries are the public registries whose names our images and
// scenarios use: docker.io (nginx), ghcr.io (the operator, its bundle, the
// sample's proxy images), registry.k8s.io (pause), quay.io (OLM's opm and
// util images), registry.access.redhat.com (operator-sdk's decompression
// image).
var MirroredRegistries = []string{"docker.io", "ghcr.io", "quay.io", "registry.access.redhat.com", "registry.k8s.io"}

// unmirroredRepository is the local repository prefix the _default entry
// sends every other registry to: nothing is pushed there, so such a pull
// fails on this machine (404) instead of going to the internet.
const unmirroredRepository = "unmirrored"

var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?$`)

// containerdHosts returns containerd's registry host configuration (the
// directory its CRI `config_path` names, in the certs.d layout of
// containerd's docs/hosts.md) that makes containerd pull every image from
// the local registry at addr, as this package pushes them (LocalReference):
//
//   - <upstream>/hosts.toml for each upstream: the registry at addr is the
//     only server, the API root /v2/<upstream> (override_path), so
//     ghcr.io/hookwright/proxy:1.4.2 is fetched from
//     http://<addr>/v2/ghcr.io/hookwright/proxy/manifests/1.4.2. With no
//     upstream fallback, a missing image fails here, never off the machine.
//   - <addr's host>_<port>_/hosts.toml: names already on addr (the bundle
//     image `operator-sdk run bundle` is given) go to it as they are.
//   - _default/hosts.toml: every other registry goes to addr's
//     unmirroredRepository prefix, which is empty.
//
// The result maps slash-separated paths relative to that directory to
// file contents. addr must be a loopback host:port; upstreams are
// registry host names (docker.io, not index.docker.io).
func containerdHosts(addr string, upstreams []string) (map[string]string, error) {
	host, port, err := loopbackHostPort(addr)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	ups := append([]string(nil), upstreams...)
	sort.Strings(ups)
	for _, u := range ups {
		if !hostnameRE.MatchString(u) || u == "_default" {
			return nil, fmt.Errorf("ociimage: containerd hosts: registry %q: want a lower-case host name", u)
		}
		if u == "index.docker.io" || u == "registry-1.docker.io" {
			return nil, fmt.Errorf("ociimage: containerd hosts: registry %q: containerd names it docker.io", u)
		}
		files[hostDirectory(u)+"/hosts.toml"] = hostsTOML(
			u+"'s images come from the local registry only (no upstream fallback).",
			"http://"+host+":"+port+"/v2/"+u, true)
	}
	files[host+"_"+port+"_/hosts.toml"] = hostsTOML("The local registry itself.", "http://"+host+":"+port, false)
	files["_default/hosts.toml"] = hostsTOML(
		"Any other registry: an empty prefix of the local registry, so its pulls fail here.",
		"http://"+host+":"+port+"/v2/"+unmirroredRepository, true)
	return files, nil
}

// containerdTLSHosts returns containerd's host configuration (as
// containerdHosts) for the HTTPS listener of a local registry
// (Registry.TLSAddr): pulls of <tlsAddr>/repo:tag go to
// https://<tlsAddr>, whose certificate containerd verifies against the
// CA file caFile (Registry.WriteTLSFiles). So the image names host-side
// tools read over HTTPS (operator-sdk's bundle and index images) are
// pulled the same way, verified, by the node. tlsAddr must be a loopback
// host:port and caFile an absolute path.
func containerdTLSHosts(tlsAddr, caFile string) (map[string]string, error) {
	host, port, err := loopbackHostPort(tlsAddr)
	if err != nil {
		return nil, err
	}
	if !filepath.IsAbs(caFile) {
		return nil, fmt.Errorf("ociimage: containerd hosts: CA file %q: want an absolute path", caFile)
	}
	toml := hostsTOML("The local registry's HTTPS listener, its certificate verified.", "https://"+host+":"+port, false)
	toml += "ca = " + strconv.Quote(caFile) + "\n"
	return map[string]string{host + "_" + port + "_/hosts.toml": toml}, nil
}

// WriteContainerdHosts writes containerdHosts(addr, upstreams) under dir.
func WriteContainerdHosts(dir, addr string, upstreams []string) error {
	files, err := containerdHosts(addr, upstreams)
	if err != nil {
		return err
	}
	return writeHostFiles(dir, files)
}

// WriteContainerdTLSHosts writes containerdTLSHosts(tlsAddr, caFile)
// under dir.
func WriteContainerdTLSHosts(dir, tlsAddr, caFile string) error {
	files, err := containerdTLSHosts(tlsAddr, caFile)
	if err != nil {
		return err
	}
	return writeHostFiles(dir, files)
}

func writeHostFiles(dir string, files map[string]string) error {
	for rel, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// loopbackHostPort splits a loopback host:port, an IPv6 host in brackets
// as in a URL and containerd's host directory names.
func loopbackHostPort(addr string) (host, port string, err error) {
	if err := checkLoopback(addr); err != nil {
		return "", "", err
	}
	host, port, _ = net.SplitHostPort(addr)
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host, port, nil
}

// hostDirectory is containerd's directory name for a host with a port
// (config.hostDirectory: "host:5000" -> "host_5000_").
func hostDirectory(h string) string {
	if i := strings.LastIndex(h, ":"); i > 0 {
		return h[:i] + "_" + h[i+1:] + "_"
	}
	return h
}

func hostsTOML(comment, server string, overridePath bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by hookwright's hack/ociimage. %s\n", comment)
	fmt.Fprintf(&b, "server = %s\n", strconv.Quote(server))
	b.WriteString("capabilities = [\"pull\", \"resolve\"]\n")
	if overridePath {
		b.WriteString("override_path = true\n")
	}
	return b.String()
}
