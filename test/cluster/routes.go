package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ExposeLocal makes Service namespace/name (created if missing, with no
// selector) reach local, a host:port on this machine, from the API server.
// Every port of the Service is routed to local. It returns the Service.
func (c *Cluster) ExposeLocal(ctx context.Context, namespace, name string, port int32, local string) (*corev1.Service, error) {
	svc := &corev1.Service{}
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, svc)
	if apierrors.IsNotFound(err) {
		svc = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
				Name: "https", Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolTCP,
			}}},
		}
		err = c.Client.Create(ctx, svc)
	}
	if err != nil {
		return nil, fmt.Errorf("service %s/%s: %w", namespace, name, err)
	}
	return svc, c.RouteService(svc, local)
}

// RouteService routes every port of an existing Service to local.
func (c *Cluster) RouteService(svc *corev1.Service, local string) error {
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return fmt.Errorf("service %s/%s has no ClusterIP", svc.Namespace, svc.Name)
	}
	for _, p := range svc.Spec.Ports {
		c.Egress.Route(fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, p.Port), local)
	}
	return nil
}

// UnrouteService removes the routes of svc: calls to it then fail as if no
// endpoint were ready.
func (c *Cluster) UnrouteService(svc *corev1.Service) {
	for _, p := range svc.Spec.Ports {
		c.Egress.Unroute(fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, p.Port))
	}
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
