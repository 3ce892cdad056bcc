package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/serving"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func init() {
	subcommands = append(subcommands, newInjectorCommand)
}

type injectorOptions struct {
	injector          string
	operatorNamespace string
	metricsAddr       string
	probeAddr         string
	serving           serving.Options
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
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	o.serving.AddFlags(fs)
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
	ctrl.SetLogger(zap.New())
	log := ctrl.Log.WithName("injector").WithValues("injector", o.injector)
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	version, err := serverVersion(restCfg)
	if err != nil {
		// Without a version, nativeSidecars Auto means off: safe on any cluster.
		log.Error(err, "cannot read the API server version; nativeSidecars Auto will mean Disabled")
	}
	log.Info("API server", "version", version)

	mgr, err := newWebhookManager(restCfg, &o.serving, o.metricsAddr, o.probeAddr, cache.Options{ByObject: map[client.Object]cache.ByObject{
		// Watch only our own SidecarInjector.
		&v1alpha1.SidecarInjector{}: {Field: fields.OneTermEqualSelector("metadata.name", o.injector)},
	}})
	if err != nil {
		return err
	}

	store := &sidecar.Store{OnChange: sidecar.RecordConfig}
	handler := &sidecar.Handler{
		Store:    store,
		Params:   sidecar.Params{OperatorNamespace: o.operatorNamespace, ServerVersion: version},
		Log:      log,
		Injector: o.injector,
		Envelope: o.serving.Envelope(),
	}
	ws := mgr.GetWebhookServer()
	ws.Register("/inject", handler)
	ws.Register("/configz", store.ConfigzHandler(o.injector))
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", ws.StartedChecker()); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("config", func(*http.Request) error {
		if store.Load() == nil {
			return sidecar.ErrNoConfig
		}
		return nil
	}); err != nil {
		return err
	}

	// An informer event handler rather than a reconciler: each update is
	// compiled as soon as the watch delivers it, with no work queue between.
	inf, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.SidecarInjector{})
	if err != nil {
		return err
	}
	load := func(obj any) {
		cr, ok := obj.(*v1alpha1.SidecarInjector)
		if !ok || cr.Name != o.injector {
			return
		}
		if cur := store.Load(); cur != nil && cur.Generation == cr.Generation && cur.UID == cr.UID {
			return // status-only update or resync
		}
		if c, err := store.Update(cr); err != nil {
			sidecar.RecordConfigError(o.injector)
			log.Error(err, "new SidecarInjector version rejected; still serving the last good one", "generation", cr.Generation)
		} else {
			log.Info("serving SidecarInjector", "generation", c.Generation, "hash", c.Hash)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    load,
		UpdateFunc: func(_, obj any) { load(obj) },
		DeleteFunc: func(any) {
			log.Info("SidecarInjector deleted; still serving the last loaded version")
		},
	}); err != nil {
		return err
	}
	log.Info("starting", "webhook-port", o.serving.Port)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	return nil
}
