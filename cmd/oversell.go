package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/configwatch"
	"github.com/hookwright/hookwright/webhooks/oversell"
)

func init() {
	subcommands = append(subcommands, newOversellCommand)
}

type oversellOptions struct {
	webhookServerOptions
	trustedReporters []string
	nodeOversell     string
	maxHeartbeatAge  time.Duration
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
	fs.StringArrayVar(&o.trustedReporters, "trusted-reporter", nil,
		"user name whose nodes/status writes carry the real allocatable for every node, like the node's own kubelet (repeatable)")
	fs.StringVar(&o.nodeOversell, "node-oversell", "",
		"name of the NodeOversell this server acts for: it changes only nodes that NodeOversell wins and passes other writes through, "+
			"so overlapping NodeOversells (one webhook each) never both amplify; empty acts for whichever NodeOversell wins (one server behind one webhook)")
	fs.DurationVar(&o.maxHeartbeatAge, "max-heartbeat-age", oversell.DefaultMaxHeartbeatAge,
		"hold a kubelet patch that only restates raw allocatable and heartbeat times (answered so that the API server stores nothing) "+
			"while every stored lastHeartbeatTime of the node is younger than this; the default is the kubelet's nodeStatusReportFrequency, "+
			"so conditions never get staler than on a plain node; 0 never holds")
	o.addFlags(fs)
	return cmd
}

// errNotSynced is the readiness failure before the NodeOversell cache syncs.
var errNotSynced = errors.New("NodeOversell cache not synced")

func runOversell(ctx context.Context, o *oversellOptions) error {
	// A server whose NodeOversell is being deleted has no caller left: it
	// does not wait for the API server to close its connections.
	gone := new(atomic.Bool)
	if o.nodeOversell != "" {
		o.serving.Unreachable = gone.Load
	}
	_, mgr, err := o.start(cache.Options{})
	if err != nil {
		return err
	}
	if o.nodeOversell != "" {
		if err := configwatch.MarkGone(ctx, mgr.GetCache(), &v1alpha1.NodeOversell{}, o.nodeOversell, gone); err != nil {
			return err
		}
	}
	log := ctrl.Log.WithName("oversell")
	m, err := oversell.NewMetrics(metrics.Registry)
	if err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	store := oversell.NewStore(o.trustedReporters, log.WithName("config"), m)
	if err := configwatch.NodeOversells(ctx, mgr.GetCache(), store, log.WithName("config")); err != nil {
		return err
	}
	h := oversell.NewHandler(store, m, log.WithName("handler")).ForNodeOversell(o.nodeOversell)
	h.Envelope = o.serving.Envelope()
	h.MaxHeartbeatAge = o.maxHeartbeatAge
	if err := registerWebhooks(mgr, map[string]http.Handler{
		"/oversell": h,
		"/configz":  oversell.ConfigzHandler(store),
	}, func() error {
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
