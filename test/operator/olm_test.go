package operator

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/operator-framework/api/crds"
	apiv2 "github.com/operator-framework/api/pkg/operators/v2"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/test/cluster"
)

// operatorConditionName is the OperatorCondition OLM would create for the
// installed CSV (named like it) and pass in OPERATOR_CONDITION_NAME.
const operatorConditionName = "hookwright.v0.0.0-test"

// upgradeable records every Upgradeable condition the operator writes to
// its OperatorCondition, from a watch started before the operator.
var upgradeable = &conditionHistory{}

type upgradeableEntry struct {
	at      time.Time
	status  metav1.ConditionStatus
	message string
}

type conditionHistory struct {
	mu      sync.Mutex
	entries []upgradeableEntry
}

func (h *conditionHistory) add(c *metav1.Condition) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.entries); n > 0 && h.entries[n-1].status == c.Status && h.entries[n-1].message == c.Message {
		return
	}
	h.entries = append(h.entries, upgradeableEntry{at: time.Now(), status: c.Status, message: c.Message})
}

func (h *conditionHistory) snapshot() []upgradeableEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]upgradeableEntry(nil), h.entries...)
}

func (h *conditionHistory) String() string {
	var b strings.Builder
	for _, e := range h.snapshot() {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.at.Format("15:04:05.000"), e.status, e.message)
	}
	return b.String()
}

// setupOLM installs OLM's OperatorCondition CRD (from operator-framework/api,
// as OLM serves it), creates the operator's OperatorCondition as OLM does
// for an installed CSV, sets OPERATOR_CONDITION_NAME for the in-process
// operator and starts recording Upgradeable.
func setupOLM(ctx context.Context) error {
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{crds.OperatorCondition()}, MaxTime: 2 * time.Minute}); err != nil {
		return fmt.Errorf("install the OperatorCondition CRD: %w", err)
	}
	if err := env.Client.Create(ctx, &apiv2.OperatorCondition{
		ObjectMeta: metav1.ObjectMeta{Name: operatorConditionName, Namespace: operatorNS},
		Spec:       apiv2.OperatorConditionSpec{Deployments: []string{"hookwright-controller-manager"}},
	}); err != nil {
		return err
	}
	if err := os.Setenv(controllers.OperatorConditionEnv, operatorConditionName); err != nil {
		return err
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	w, err := wc.Watch(ctx, &apiv2.OperatorConditionList{}, client.InNamespace(operatorNS))
	if err != nil {
		return err
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if oc, ok := ev.Object.(*apiv2.OperatorCondition); ok && oc.Name == operatorConditionName {
				if c := apimeta.FindStatusCondition(oc.Spec.Conditions, apiv2.Upgradeable); c != nil {
					upgradeable.add(c)
				}
			}
		}
	}()
	return nil
}

// waitUpgradeable waits until the history holds an entry at or after since
// with status and a message containing substr, and returns it.
func waitUpgradeable(t *testing.T, ctx context.Context, since time.Time, status metav1.ConditionStatus, substr string) upgradeableEntry {
	t.Helper()
	var found upgradeableEntry
	err := cluster.WaitFor(ctx, 60*time.Second, fmt.Sprintf("Upgradeable=%s (%q)", status, substr), func(context.Context) (bool, error) {
		for _, e := range upgradeable.snapshot() {
			if !e.at.Before(since) && e.status == status && strings.Contains(e.message, substr) {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v; history:%s", err, upgradeable)
	}
	return found
}

// Under OLM (OPERATOR_CONDITION_NAME set) the operator says Upgradeable=True
// when idle and False while a NodeOversell restores its nodes; the CA
// rotation test checks the same for a rotation.
func TestUpgradeableDuringNodeOversellRestore(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	start := time.Now()
	// Idle (the CA rotation test, if it ran first, has finished).
	waitUpgradeable(t, ctx, time.Time{}, metav1.ConditionTrue, "no CA rotation or NodeOversell restore in progress")

	no := &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "olm-restore"},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "olm-restore-none"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		},
	}
	create(t, ctx, no)
	err := cluster.WaitFor(ctx, 60*time.Second, "finalizer added", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(no), no); err != nil {
			return false, err
		}
		return len(no.Finalizers) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if err := env.Client.Delete(ctx, no); err != nil {
		t.Fatal(err)
	}
	held := waitUpgradeable(t, ctx, deleted, metav1.ConditionFalse, "NodeOversell olm-restore restoring its nodes")
	released := waitUpgradeable(t, ctx, held.at, metav1.ConditionTrue, "no CA rotation")
	t.Logf("Upgradeable=False %s after the delete, True again %s later; history since the test began:%s",
		held.at.Sub(deleted).Round(time.Millisecond), released.at.Sub(held.at).Round(time.Millisecond), historySince(start))
}

func historySince(since time.Time) string {
	var b strings.Builder
	for _, e := range upgradeable.snapshot() {
		if !e.at.Before(since) {
			fmt.Fprintf(&b, "\n  %s %s: %s", e.at.Format("15:04:05.000"), e.status, e.message)
		}
	}
	return b.String()
}
