package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hookwright/hookwright/cmd/app"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/serverpolicy"
	"github.com/hookwright/hookwright/test/cluster"
)

// operatorNS is the operator's namespace and its servers' (the default).
const operatorNS = "hookwright-system"

var (
	operatorOnce sync.Once
	operatorErr  error
	// stopOperator stops the in-process operator (TestMain, after the
	// tests removed their CRs).
	stopOperator = func() {}
)

// startOperator runs the controllers in this process, as `hookwright
// manager` wires them (no validating webhook, no leader election), once
// for the package. Its server pods run on the real node: the scheduler
// has no other node.
func startOperator(t *testing.T) {
	t.Helper()
	operatorOnce.Do(func() { operatorErr = runOperator() })
	if operatorErr != nil {
		t.Fatalf("start operator: %v", operatorErr)
	}
}

func runOperator() error {
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := env.CreateNamespace(ctx, operatorNS, nil); err != nil {
		cancel()
		return err
	}
	f, err := os.Create(filepath.Join(env.Dir, "logs", "operator.log"))
	if err != nil {
		cancel()
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(f)))
	if err := controllers.AddToScheme(env.Scheme); err != nil {
		cancel()
		return err
	}
	// The operator image and the other test images of the local registry.
	servers, err := serverpolicy.New(operatorNS, serverImage, nil,
		[]string{ociimage.StandinName, registryHost + "/*"})
	if err != nil {
		cancel()
		return err
	}
	// The production manager (cmd/app), without the validating
	// webhook (no webhook Service).
	mgr, err := app.New(env.Config, app.Options{
		Metrics: metricsserver.Options{BindAddress: "0"}, ProbeAddr: "0",
		Servers: servers,
		Settings: controllers.Settings{
			Settings: desired.Settings{
				Namespace: operatorNS, Image: serverImage,
				AllowedNamespaces: servers.Namespaces, AllowedImages: servers.Images,
			},
			// The rollout test waits for fleet counts after each step:
			// 1 s between two fleet status writes rather than 5 s, as
			// test/operator runs it.
			FleetWriteInterval: time.Second,
		},
	})
	if err != nil {
		cancel()
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	stopOperator = func() {
		cancel()
		<-done
		f.Close()
	}
	return nil
}

// waitCondition polls obj until its condition typ satisfies ok, and
// returns the condition and when it was first seen so.
func waitCondition(ctx context.Context, t *testing.T, obj client.Object, conds func() []metav1.Condition, typ string, ok func(*metav1.Condition) bool, d time.Duration) (metav1.Condition, time.Time) {
	t.Helper()
	var last *metav1.Condition
	err := cluster.WaitFor(ctx, d, fmt.Sprintf("%s condition %s", obj.GetName(), typ), func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err
		}
		last = apimeta.FindStatusCondition(conds(), typ)
		return last != nil && ok(last), nil
	})
	if err != nil {
		t.Fatalf("%v; conditions %+v", err, conds())
	}
	return *last, time.Now()
}
