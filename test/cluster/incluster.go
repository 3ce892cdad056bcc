package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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
	// Endpoints are deprecated since v1.33 but still what older clients
	// read for the kubernetes Service; the API server's warning is noise.
	cfg := rest.CopyConfig(c.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	quiet, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := quiet.CoreV1().Endpoints(ep.Namespace).Create(ctx, ep, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubernetes Endpoints: %w", err)
	}
	if _, err := c.Clientset.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubernetes EndpointSlice: %w", err)
	}
	return nil
}
