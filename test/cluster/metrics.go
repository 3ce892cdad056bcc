package cluster

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsresource "sigs.k8s.io/kwok/kustomize/metrics/resource"
	metricsusage "sigs.k8s.io/kwok/kustomize/metrics/usage"
)

// metrics.k8s.io in the harness (Options.MetricsServer): metrics-server
// v0.9.0 (bin/metrics-server) runs on the host and serves the API through
// the aggregation layer, as in a cluster:
//
//   - the API server gets front-proxy certificates (--requestheader-* and
//     --proxy-client-*, kubeadm's front-proxy-ca and front-proxy-client),
//     so it authenticates itself to metrics-server, which reads the
//     front-proxy CA from the extension-apiserver-authentication ConfigMap;
//   - APIService v1beta1.metrics.k8s.io points at Service
//     kube-system/metrics-server, routed to metrics-server's port
//     (ExposeLocal); the caBundle and serving certificate (for
//     metrics-server.kube-system.svc) come from a harness CA;
//   - metrics-server scrapes each real node's kubelet /metrics/resource
//     with the API server's kubelet client certificate, and kwok's
//     emulation of it for kwok nodes (kwok serves
//     /metrics/nodes/{node}/metrics/resource, named by the node annotation
//     metrics.k8s.io/resource-metrics-path; usage from the pod
//     annotations kwok.x-k8s.io/usage-cpu and usage-memory through kwok's
//     ClusterResourceUsage usage-from-annotation, or ResourceUsage objects).
//     kwok nodes then have InternalIP 127.0.0.1 and kwok's port as their
//     kubelet port. kwok's HTTPS certificate is a test one and the real
//     kubelet's is the harness CA's, so the kubelet TLS is not verified
//     (--kubelet-insecure-tls, as kwokctl runs it).

// MetricsResourcePathAnnotation is metrics-server's node annotation that
// overrides the kubelet path it scrapes.
const MetricsResourcePathAnnotation = "metrics.k8s.io/resource-metrics-path"

// Usage annotations of kwok pods (kwok's usage-from-annotation).
const (
	KwokUsageCPUAnnotation    = "kwok.x-k8s.io/usage-cpu"
	KwokUsageMemoryAnnotation = "kwok.x-k8s.io/usage-memory"
)

const (
	metricsServerNS   = "kube-system"
	metricsServerName = "metrics-server"
	pkiFrontProxyCA   = "front-proxy-ca.crt"
	pkiFrontProxyCert = "front-proxy-client.crt"
	pkiFrontProxyKey  = "front-proxy-client.key"
	frontProxyUser    = "front-proxy-client"
	// metricsServerEndpointIP is in the node-only pod range, never a
	// slot's, like APIRelayIP: nothing dials it.
	metricsServerEndpointIP = "10.248.255.2"
)

var apiServiceGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}

// frontProxyArgs writes the front-proxy CA and the aggregator's client
// certificate into dir and returns the API server flags that use them.
func frontProxyArgs(dir string) (map[string][]string, error) {
	ca, err := newCA("hookwright-front-proxy-ca", pkiValidity)
	if err != nil {
		return nil, err
	}
	cert, key, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: frontProxyUser},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{pkiFrontProxyCA: ca.CertPEM, pkiFrontProxyCert: cert, pkiFrontProxyKey: key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return map[string][]string{
		"requestheader-client-ca-file":       {filepath.Join(dir, pkiFrontProxyCA)},
		"requestheader-allowed-names":        {frontProxyUser},
		"requestheader-username-headers":     {"X-Remote-User"},
		"requestheader-group-headers":        {"X-Remote-Group"},
		"requestheader-extra-headers-prefix": {"X-Remote-Extra-"},
		"proxy-client-cert-file":             {filepath.Join(dir, pkiFrontProxyCert)},
		"proxy-client-key-file":              {filepath.Join(dir, pkiFrontProxyKey)},
	}, nil
}

// kwokMetricsConfig are kwok's Metric (the kubelet's /metrics/resource)
// and ClusterResourceUsage (usage from pod annotations) documents.
func kwokMetricsConfig() []string {
	return []string{metricsresource.DefaultMetricsResource, metricsusage.DefaultUsageFromAnnotation}
}

// kwokNodeMetricsPath is the path kwok serves node's resource metrics on.
func kwokNodeMetricsPath(node string) string {
	return "/metrics/nodes/" + node + "/metrics/resource"
}

// startMetricsServer starts metrics-server and registers its APIService;
// it returns once metrics.k8s.io lists node metrics.
func (c *Cluster) startMetricsServer(ctx context.Context) error {
	bin := filepath.Join(c.Bin, "metrics-server")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s not built: run hack/tools.sh (make tools): %w", bin, err)
	}
	if c.metricsCA == nil {
		ca, err := NewTestCA("hookwright-metrics-server-ca")
		if err != nil {
			return err
		}
		c.metricsCA = ca
		if err := ca.WriteServing(filepath.Join(c.Dir, "metrics-server"), ServiceDNSNames(metricsServerNS, metricsServerName)...); err != nil {
			return err
		}
		port, err := FreePort()
		if err != nil {
			return err
		}
		c.metricsPort = port
	}
	certs := c.APIServerCertDir()
	dir := filepath.Join(c.Dir, "metrics-server")
	res := c.opts.MetricsResolution
	if res == 0 {
		res = 10 * time.Second
	}
	args := append(c.kubeconfigArgs(),
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.metricsPort),
		"--tls-cert-file="+filepath.Join(dir, "tls.crt"),
		"--tls-private-key-file="+filepath.Join(dir, "tls.key"),
		"--metric-resolution="+res.String(),
		"--kubelet-use-node-status-port",
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-insecure-tls",
		// It must be below the resolution.
		"--kubelet-request-timeout=5s",
		"--kubelet-client-certificate="+filepath.Join(certs, pkiKubeletClient),
		"--kubelet-client-key="+filepath.Join(certs, pkiKubeletKey),
		"--v=1",
	)
	c.opts.Logf("cluster: starting metrics-server (resolution %s)", res)
	p, err := StartProcess("metrics-server", filepath.Join(c.Dir, "logs"), bin, args, nil)
	if err != nil {
		return err
	}
	c.metricsProc = p
	c.procs = append(c.procs, p)
	if _, err := c.ExposeLocal(ctx, metricsServerNS, metricsServerName, 443, fmt.Sprintf("127.0.0.1:%d", c.metricsPort)); err != nil {
		return err
	}
	// The aggregator's availability check wants a ready endpoint behind
	// the Service; its calls go to the ClusterIP, which the egress proxy
	// routes to metrics-server, so the address is never dialled.
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: metricsServerNS, Name: metricsServerName,
			Labels: map[string]string{discoveryv1.LabelServiceName: metricsServerName, discoveryv1.LabelManagedBy: endpointManager}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{metricsServerEndpointIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](443), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := c.Clientset.DiscoveryV1().EndpointSlices(metricsServerNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("metrics-server EndpointSlice: %w", err)
	}
	as := &unstructured.Unstructured{}
	as.SetGroupVersionKind(apiServiceGVK)
	as.SetName("v1beta1.metrics.k8s.io")
	if err := c.Client.Get(ctx, client.ObjectKeyFromObject(as), as); apierrors.IsNotFound(err) {
		as.Object["spec"] = map[string]any{
			"service":              map[string]any{"namespace": metricsServerNS, "name": metricsServerName, "port": int64(443)},
			"group":                "metrics.k8s.io",
			"version":              "v1beta1",
			"caBundle":             base64.StdEncoding.EncodeToString(c.metricsCA.CertPEM),
			"groupPriorityMinimum": int64(100),
			"versionPriority":      int64(100),
		}
		if err := c.Client.Create(ctx, as); err != nil {
			return fmt.Errorf("APIService v1beta1.metrics.k8s.io: %w", err)
		}
	} else if err != nil {
		return err
	}
	return WaitFor(ctx, 2*time.Minute, "metrics.k8s.io served", func(ctx context.Context) (bool, error) {
		if err := p.exitErr(3000); err != nil {
			return false, Permanent(err)
		}
		err := c.Clientset.CoreV1().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/nodes").Do(ctx).Error()
		return err == nil, err
	})
}

// StopMetricsServer stops metrics-server (metrics.k8s.io then fails with
// 503 ServiceUnavailable, as when its pods are gone); StartMetricsServer
// starts it again on the same port.
func (c *Cluster) StopMetricsServer() error {
	if c.metricsProc == nil {
		return fmt.Errorf("metrics-server is not running (Options.MetricsServer)")
	}
	err := c.metricsProc.Stop(10 * time.Second)
	c.metricsProc = nil
	return err
}

// StartMetricsServer starts metrics-server again after StopMetricsServer.
func (c *Cluster) StartMetricsServer(ctx context.Context) error {
	if c.metricsProc != nil {
		return nil
	}
	if c.metricsCA == nil {
		return fmt.Errorf("the cluster was started without Options.MetricsServer")
	}
	return c.startMetricsServer(ctx)
}

// SetPodUsage sets the usage kwok reports for a kwok pod (its annotations
// kwok.x-k8s.io/usage-cpu and usage-memory; "" leaves one as it is).
func (c *Cluster) SetPodUsage(ctx context.Context, namespace, name, cpu, memory string) error {
	ann := map[string]string{}
	if cpu != "" {
		ann[KwokUsageCPUAnnotation] = cpu
	}
	if memory != "" {
		ann[KwokUsageMemoryAnnotation] = memory
	}
	var parts []string
	for k, v := range ann {
		parts = append(parts, fmt.Sprintf("%q:%q", k, v))
	}
	patch := `{"metadata":{"annotations":{` + strings.Join(parts, ",") + `}}}`
	p := &corev1.Pod{}
	p.Namespace, p.Name = namespace, name
	return c.Client.Patch(ctx, p, client.RawPatch("application/merge-patch+json", []byte(patch)))
}
