package controllers

import (
	"context"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/internal/health"
)

// ConfigLoaded is read from the servers themselves: each ready server pod
// serves GET /configz on its webhook port, which the operator reads through
// the API server's pods proxy
// (/api/v1/namespaces/NS/pods/https:POD:9443/proxy/configz; the API server
// dials the pod through its egress selector and does not verify the pod's
// certificate, which is the operator's own anyway). No new port, Service
// or NetworkPolicy exception is needed, and RBAC is one verb on one
// subresource.
// (Listing pods is granted in overcommit.go.)
// +kubebuilder:rbac:groups="",namespace=system,resources=pods/proxy,verbs=get

// configLoadedPoll is how often ConfigLoaded is read again while it is not
// True (a server reloads a new generation within about a second).
const configLoadedPoll = 5 * time.Second

// configzFetcher returns the /configz body of a pod's webhook port.
type configzFetcher func(ctx context.Context, namespace, pod string, port int) ([]byte, error)

// podsProxyFetcher reads /configz through the API server's pods proxy.
func podsProxyFetcher(cs kubernetes.Interface) configzFetcher {
	return func(ctx context.Context, ns, pod string, port int) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return cs.CoreV1().Pods(ns).ProxyGet("https", pod, strconv.Itoa(port), "configz", nil).DoRaw(ctx)
	}
}

// configLoaded sets ConfigLoaded and status.servedGeneration from the ready
// pods of op's Deployment and returns when to look again (0: True, nothing
// to poll).
func (r *reconciler) configLoaded(ctx context.Context, op desired.CR) time.Duration {
	if r.fetchConfigz == nil {
		return 0
	}
	ns := desired.ServerNamespace(op, r.Settings.Settings)
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels(desired.SelectorLabels(op))); err != nil {
		log.FromContext(ctx).Error(err, "list server pods for ConfigLoaded")
		return configLoadedPoll
	}
	var got []health.PodServing
	for i := range pods.Items {
		p := &pods.Items[i]
		if !podReady(p) {
			continue
		}
		body, err := r.fetchConfigz(ctx, ns, p.Name, desired.WebhookPort)
		if err != nil {
			log.FromContext(ctx).V(1).Info("read /configz", "pod", p.Name, "error", err.Error())
			got = append(got, health.PodServing{Pod: p.Name, Problem: "unreachable"})
			continue
		}
		s := r.kind.ServedGeneration(op.Object.GetName(), body)
		s.Pod = p.Name
		got = append(got, s)
	}
	ok, reason, msg, served := health.ConfigLoadedState(op.Object.GetGeneration(), got)
	r.setCondition(op, v1alpha1.ConditionConfigLoaded, ok, reason, msg)
	op.Object.SetServedGeneration(served)
	if ok {
		return 0
	}
	return configLoadedPoll
}

// podReady: Ready condition True, an IP, and not terminating.
func podReady(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.PodIP != "" && fleet.PodReady(p)
}
