package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/webhooks/oversell"
	"github.com/hookwright/hookwright/webhooks/serving"
)

func init() {
	subcommands = append(subcommands, newOversellCommand)
}

type oversellOptions struct {
	metricsAddr      string
	probeAddr        string
	trustedReporters []string
	nodeOversell     string
	serving          serving.Options
	zap              zap.Options
}

func newOversellCommand() *cobra.Command {
	o := &oversellOptions{}
	cmd := &cobra.Command{
		Use:   "oversell",
		Short: "Serve the node allocatable oversell webhook (/oversell) for one or all NodeOversell objects",
		Long: `Serve AdmissionReview v1 for UPDATE of nodes/status at /oversell on the
webhook HTTPS listener. The server watches every NodeOversell; each add,
update or delete swaps in a new configuration snapshot that applies to the
next node status write, without a restart. /configz (same listener) reports
the generation served per NodeOversell and a hash. Readiness passes once the
NodeOversell cache has synced; before that, writes are admitted unchanged.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runOversell(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringArrayVar(&o.trustedReporters, "trusted-reporter", nil,
		"user name whose nodes/status writes carry the real allocatable for every node, like the node's own kubelet (repeatable)")
	fs.StringVar(&o.nodeOversell, "node-oversell", "",
		"name of the NodeOversell this server acts for: it changes only nodes that NodeOversell wins and passes other writes through, "+
			"so overlapping NodeOversells (one webhook each) never both amplify; empty acts for whichever NodeOversell wins (one server behind one webhook)")
	o.serving.AddFlags(fs)
	gfs := flag.NewFlagSet("zap", flag.ContinueOnError)
	o.zap.BindFlags(gfs)
	fs.AddGoFlagSet(gfs)
	return cmd
}

// errNotSynced is the readiness failure before the NodeOversell cache syncs.
var errNotSynced = errors.New("NodeOversell cache not synced")

func runOversell(ctx context.Context, o *oversellOptions) error {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	log := ctrl.Log.WithName("oversell")

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, err := newWebhookManager(cfg, &o.serving, o.metricsAddr, o.probeAddr, cache.Options{})
	if err != nil {
		return err
	}

	m, err := oversell.NewMetrics(metrics.Registry)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	store := oversell.NewStore(o.trustedReporters, log.WithName("config"), m)
	// An informer event handler rather than a reconciler: each change is
	// published as soon as the watch delivers it, with no work queue between.
	if err := store.Watch(ctx, mgr.GetCache()); err != nil {
		return err
	}

	ws := mgr.GetWebhookServer()
	h := oversell.NewHandler(store, m, log.WithName("handler")).ForNodeOversell(o.nodeOversell)
	h.Envelope = o.serving.Envelope()
	ws.Register("/oversell", h)
	ws.Register("/configz", oversell.ConfigzHandler(store))
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", ws.StartedChecker()); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("config", func(*http.Request) error {
		if !store.Synced() {
			return errNotSynced
		}
		return nil
	}); err != nil {
		return err
	}

	log.Info("starting", "webhook-port", o.serving.Port, "trustedReporters", o.trustedReporters, "nodeOversell", o.nodeOversell)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("oversell: %w", err)
	}
	return nil
}
