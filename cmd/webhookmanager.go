package main

import (
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hookwright/hookwright/cmd/app"
	"github.com/hookwright/hookwright/webhooks/listener"
)

// webhookServerOptions are the flags both webhook servers (injector,
// oversell) share: listener and TLS (listener.Options), metrics and probe
// addresses, zap's logging flags, and --kubeconfig and --context.
type webhookServerOptions struct {
	metricsAddr string
	probeAddr   string
	serving     listener.Options
	zap         zap.Options
	cluster     clusterFlags
}

func (o *webhookServerOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	o.serving.AddFlags(fs)
	gfs := flag.NewFlagSet("zap", flag.ContinueOnError)
	o.zap.BindFlags(gfs)
	fs.AddGoFlagSet(gfs)
	o.cluster.addServerFlags(fs)
}

// start sets the logger from the zap flags and returns the client config
// and the controller-runtime manager the server runs on: the HTTPS webhook
// server from the listener options, metrics and probes, and no leader
// election (every replica serves, so every replica watches its
// configuration).
func (o *webhookServerOptions) start(cacheOpts cache.Options) (*rest.Config, ctrl.Manager, error) {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	cfg, err := o.cluster.restConfig()
	if err != nil {
		return nil, nil, err
	}
	scheme, err := app.NewScheme()
	if err != nil {
		return nil, nil, err
	}
	srv, err := o.serving.NewServer()
	if err != nil {
		return nil, nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress: o.probeAddr,
		WebhookServer:          srv,
		LeaderElection:         false,
		Cache:                  cacheOpts,
		// Room for the webhook server's drain and in-flight reviews.
		GracefulShutdownTimeout: ptr.To(o.serving.ShutdownBound() + 10*time.Second),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("create manager: %w", err)
	}
	return cfg, mgr, nil
}

// registerWebhooks registers the server's handlers on the webhook listener,
// /healthz, and /readyz passing once the listener accepts TLS and loaded()
// returns nil (a configuration is loaded).
func registerWebhooks(mgr ctrl.Manager, handlers map[string]http.Handler, loaded func() error) error {
	ws := mgr.GetWebhookServer()
	for path, h := range handlers {
		ws.Register(path, h)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", ws.StartedChecker()); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("config", func(*http.Request) error { return loaded() })
}
