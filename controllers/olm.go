package controllers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/hookwright/hookwright/internal/health"
	apiv2 "github.com/operator-framework/api/pkg/operators/v2"
	"github.com/operator-framework/operator-lib/conditions"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// OperatorConditionEnv names the OLM OperatorCondition of this operator;
// OLM sets it in the operator's Deployment (operator-lib's conditions
// package reads it).
const OperatorConditionEnv = "OPERATOR_CONDITION_NAME"

// upgradeResync is how often a failed OperatorCondition write is retried.
const upgradeResync = 30 * time.Second

// upgradeGate holds OLM upgrades while the operator does something an
// upgrade must not interrupt: it sets the OperatorCondition's Upgradeable
// to False while any hold is in place (a CA rotation, a NodeOversell
// restoring its nodes) and to True otherwise. OLM does not upgrade an
// operator whose OperatorCondition says Upgradeable=False
// (operator-framework/enhancements operator-conditions.md). Without
// OPERATOR_CONDITION_NAME (not installed by OLM) it does nothing. It writes
// only when the status or message changes. Safe for concurrent use; a nil
// *upgradeGate does nothing.
type upgradeGate struct {
	cond conditions.Condition
	log  logr.Logger

	mu      sync.Mutex
	holds   map[string]string // key → why
	written string            // last status and message written
}

// newUpgradeGate returns the gate for the OperatorCondition named by
// $OPERATOR_CONDITION_NAME, through operator-lib's conditions package (c
// should be uncached: the gate reads one object). In-cluster operator-lib
// takes the namespace from the ServiceAccount token mount; out of cluster
// (a local run, the tests) it is namespace. Without the variable the gate
// is disabled and says so once in the log.
func newUpgradeGate(c client.Client, namespace string, log logr.Logger) *upgradeGate {
	g := &upgradeGate{log: log.WithName("upgradeable"), holds: map[string]string{}}
	if os.Getenv(OperatorConditionEnv) == "" {
		g.log.Info("not running under OLM (" + OperatorConditionEnv + " unset): the OperatorCondition Upgradeable is not managed")
		return g
	}
	cond, err := conditions.InClusterFactory{Client: c}.NewCondition(apiv2.ConditionType(apiv2.Upgradeable))
	if err != nil {
		// Only the namespace can be missing here (no ServiceAccount mount).
		g.log.Info("OperatorCondition namespace from the ServiceAccount mount unavailable; using the operator namespace", "namespace", namespace, "reason", err.Error())
		cond = &operatorCondition{client: c, key: types.NamespacedName{Namespace: namespace, Name: os.Getenv(OperatorConditionEnv)}}
	}
	g.cond = cond
	return g
}

// Enabled reports whether the gate writes an OperatorCondition.
func (g *upgradeGate) Enabled() bool { return g != nil && g.cond != nil }

// Hold marks key (e.g. "ca-rotation") as in progress, with why for the
// condition message, and writes Upgradeable=False if it is not already.
func (g *upgradeGate) Hold(ctx context.Context, key, why string) error {
	if !g.Enabled() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holds[key] = why
	return g.syncLocked(ctx)
}

// Release ends the hold key and writes Upgradeable=True once none is left.
func (g *upgradeGate) Release(ctx context.Context, key string) error {
	if !g.Enabled() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.holds, key)
	return g.syncLocked(ctx)
}

// Start writes the initial condition and retries failed writes every
// upgradeResync until ctx ends (a manager Runnable, leader only).
func (g *upgradeGate) Start(ctx context.Context) error {
	if !g.Enabled() {
		return nil
	}
	t := time.NewTicker(upgradeResync)
	defer t.Stop()
	for {
		g.mu.Lock()
		if err := g.syncLocked(ctx); err != nil {
			g.log.Error(err, "write OperatorCondition Upgradeable; retrying", "every", upgradeResync)
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection: only the leader does the work the condition is about.
func (g *upgradeGate) NeedLeaderElection() bool { return true }

func (g *upgradeGate) syncLocked(ctx context.Context) error {
	status, reason, msg := health.UpgradeableState(g.holds)
	want := string(status) + "/" + msg
	if want == g.written {
		return nil
	}
	if err := g.cond.Set(ctx, status, conditions.WithReason(reason), conditions.WithMessage(msg)); err != nil {
		return fmt.Errorf("set OperatorCondition Upgradeable=%s: %w", status, err)
	}
	g.log.Info("OperatorCondition Upgradeable set", "status", status, "message", msg)
	g.written = want
	return nil
}

// operatorCondition is operator-lib's condition for an explicitly named
// OperatorCondition (operator-lib only builds one from the in-cluster
// namespace): the condition lives in spec.conditions, which OLM copies to
// status.
type operatorCondition struct {
	client client.Client
	key    types.NamespacedName
}

var _ conditions.Condition = &operatorCondition{}

func (c *operatorCondition) Get(ctx context.Context) (*metav1.Condition, error) {
	oc := &apiv2.OperatorCondition{}
	if err := c.client.Get(ctx, c.key, oc); err != nil {
		return nil, err
	}
	if con := apimeta.FindStatusCondition(oc.Spec.Conditions, apiv2.Upgradeable); con != nil {
		return con, nil
	}
	return nil, errors.New("condition Upgradeable not found")
}

func (c *operatorCondition) Set(ctx context.Context, status metav1.ConditionStatus, opts ...conditions.Option) error {
	oc := &apiv2.OperatorCondition{}
	if err := c.client.Get(ctx, c.key, oc); err != nil {
		return err
	}
	cond := metav1.Condition{Type: apiv2.Upgradeable, Status: status}
	for _, o := range opts {
		o(&cond)
	}
	apimeta.SetStatusCondition(&oc.Spec.Conditions, cond)
	return c.client.Update(ctx, oc)
}
