package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/webhooks/configwatch"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func init() {
	subcommands = append(subcommands, newInjectorCommand)
}

type injectorOptions struct {
	webhookServerOptions
	injector           string
	operatorNamespace  string
	operatorDeployment string
}

func newInjectorCommand() *cobra.Command {
	o := &injectorOptions{}
	cmd := &cobra.Command{
		Use:   "injector",
		Short: "Serve the sidecar injection webhook (/inject) for one SidecarInjector",
		Long: `Serve AdmissionReview v1 for pod CREATE at /inject on the webhook HTTPS
listener, using the SidecarInjector named by --injector. The server watches
that one object and swaps in each new version once it compiles, without a
restart; /configz reports the generation served. Readiness passes once a
configuration is loaded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runInjector(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.injector, "injector", "sidecar-injector", "name of the SidecarInjector to serve")
	fs.StringVar(&o.operatorNamespace, "operator-namespace", envOr("POD_NAMESPACE", "hookwright-system"), "namespace of the operator; its pods are never injected")
	fs.StringVar(&o.operatorDeployment, "operator-deployment", "",
		"the operator's Deployment, <namespace>/<name>: once it is gone, being deleted or scaled to 0 (an uninstall with this SidecarInjector kept), "+
			"this server switches its own webhook configuration and the manager's validating one to failurePolicy Ignore (checked every 10s); "+
			"the operator sets it; empty (default): off")
	o.addFlags(fs)
	return cmd
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// serverVersion asks the API server its version, for nativeSidecars Auto.
func serverVersion(cfg *rest.Config) (string, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return "", err
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return "", err
	}
	return v.GitVersion, nil
}

func runInjector(ctx context.Context, o *injectorOptions) error {
	// A server whose SidecarInjector is being deleted has no caller left:
	// it does not wait for the API server to close its connections.
	gone := new(atomic.Bool)
	o.serving.Unreachable = gone.Load
	restCfg, mgr, err := o.start(cache.Options{ByObject: map[client.Object]cache.ByObject{
		// Watch only our own SidecarInjector.
		&v1alpha1.SidecarInjector{}: {Field: fields.OneTermEqualSelector("metadata.name", o.injector)},
	}})
	if err != nil {
		return err
	}
	log := ctrl.Log.WithName("injector").WithValues("injector", o.injector)
	version, err := serverVersion(restCfg)
	if err != nil {
		// Without a version, nativeSidecars Auto means off: safe on any cluster.
		log.Error(err, "cannot read the API server version; nativeSidecars Auto will mean Disabled")
	}
	log.Info("API server", "version", version)

	m, err := sidecar.NewMetrics(metrics.Registry)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	store := &sidecar.Store{}
	if err := configwatch.SidecarInjector(ctx, mgr.GetCache(), store, o.injector, m, log); err != nil {
		return err
	}
	if err := configwatch.MarkGone(ctx, mgr.GetCache(), &v1alpha1.SidecarInjector{}, o.injector, gone); err != nil {
		return err
	}
	handler := &sidecar.Handler{
		Store:    store,
		Params:   sidecar.Params{OperatorNamespace: o.operatorNamespace, ServerVersion: version},
		Log:      log,
		Metrics:  m,
		Injector: o.injector,
		Envelope: o.serving.Envelope(),
	}
	if err := registerWebhooks(mgr, map[string]http.Handler{
		"/inject":  handler,
		"/configz": store.ConfigzHandler(o.injector),
	}, func() error {
		if store.Load() == nil {
			return sidecar.ErrNoConfig
		}
		return nil
	}); err != nil {
		return err
	}
	fo, err := newFailOpenWatch(mgr.GetClient(), mgr.GetAPIReader(), o.operatorDeployment, desired.SidecarKind.BaseName(o.injector), metrics.Registry, log)
	if err != nil {
		return err
	}
	if fo != nil {
		if err := mgr.Add(fo); err != nil {
			return err
		}
	}
	log.Info("starting", "webhook-port", o.serving.Port)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	return nil
}
