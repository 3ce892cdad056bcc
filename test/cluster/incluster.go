package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// A pod on a real node reaches the API server as in any cluster: through
// the kubernetes Service (its ClusterIP, the first of the Service CIDR, is
// KUBERNETES_SERVICE_HOST), which kube-proxy translates to the Service's
// endpoint. The API server runs with --endpoint-reconciler-type=none and the
// harness owns that endpoint: APIRelayIP:443, an address on every real
// node's loopback (inside the node-only pod range, never given to a slot),
// where a relay in the node's namespace forwards the bytes to the host's
// API server. TLS is end to end: the serving certificate carries the
// Service's IP and names (pki.go), and the pod verifies it with the
// kube-root-ca.crt kube-controller-manager publishes.
const (
	// APIRelayIP is the kubernetes Service's endpoint on every real node.
	APIRelayIP   = "10.248.255.1"
	apiRelayPort = 443
	// endpointManager marks the EndpointSlice the harness writes.
	endpointManager = "test-harness.hookwright.io"
)

// publishAPIEndpoint writes the kubernetes Service's Endpoints and
// EndpointSlice (what the API server's reconciler would write with its
// own address; pkg/controlplane/reconcilers). The Endpoints are marked
// skip-mirror so the EndpointSlice mirroring controller leaves them alone.
func (c *Cluster) publishAPIEndpoint(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "kubernetes",
			Labels: map[string]string{discoveryv1.LabelSkipMirror: "true"}},
		Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{{IP: APIRelayIP}},
			Ports:     []corev1.EndpointPort{{Name: "https", Port: apiRelayPort, Protocol: corev1.ProtocolTCP}},
		}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "kubernetes",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: endpointManager}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{APIRelayIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](apiRelayPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	// Deprecated since v1.33 but still what kube-proxy's peers and older
	// clients read for the kubernetes Service.
	//nolint:staticcheck
	if _, err := c.Clientset.CoreV1().Endpoints(ep.Namespace).Create(ctx, ep, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubernetes Endpoints: %w", err)
	}
	if _, err := c.Clientset.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubernetes EndpointSlice: %w", err)
	}
	return nil
}

// liveNodes are the real nodes started and not stopped.
func (c *Cluster) liveNodes() []*RealNode {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	var out []*RealNode
	for _, n := range c.nodes {
		if !n.stopped {
			out = append(out, n)
		}
	}
	return out
}

// dialCluster is the egress proxy's dialer for targets nobody routed to a
// local process: the API server reaching a Service's ClusterIP (webhooks,
// service proxy), a pod IP (pods/proxy) or a kubelet (logs, exec) of a real
// node. A ClusterIP is dialled from inside a real node's namespace, so
// kube-proxy's rules pick a ready endpoint as for any client there; a pod or
// node IP from the host, which routes each node's pod /24 and veth. Anything
// else is ErrNoRoute: the proxy never dials an address off this machine.
func (c *Cluster) dialCluster(target string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil, ErrNoRoute
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, ErrNoRoute
	}
	nodes := c.liveNodes()
	if _, svc, err := net.ParseCIDR(c.ServiceCIDR()); err == nil && svc.Contains(ip) {
		if len(nodes) == 0 {
			return nil, ErrNoRoute
		}
		return nodes[0].net.dialIn(target, 5*time.Second)
	}
	for _, n := range nodes {
		_, pods, err := net.ParseCIDR(n.PodSubnet)
		if err == nil && pods.Contains(ip) || host == n.IP {
			return net.DialTimeout("tcp", target, 5*time.Second)
		}
	}
	return nil, ErrNoRoute
}

// ErrNoRoute is a dialer's answer for a target it must not dial.
var ErrNoRoute = errors.New("no route to this target on this machine")
