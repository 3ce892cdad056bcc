package main

import (
	"fmt"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hookwright/hookwright/internal/manager"
	"github.com/hookwright/hookwright/webhooks/serving"
)

// newWebhookManager is the controller-runtime manager both webhook servers
// run on: the HTTPS webhook server from the serving options, metrics and
// probes, and no leader election (every replica serves, so every replica
// watches its configuration).
func newWebhookManager(cfg *rest.Config, so *serving.Options, metricsAddr, probeAddr string, cacheOpts cache.Options) (ctrl.Manager, error) {
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	srv, err := so.NewServer()
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		WebhookServer:          srv,
		LeaderElection:         false,
		Cache:                  cacheOpts,
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	return mgr, nil
}
