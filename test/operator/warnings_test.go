package operator

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
)

// Risky but valid CRs are admitted by the manager's validating webhook
// with warnings, passed on by the API server; NodeOversell failurePolicy
// Fail is rejected by the CRD's own validation.
func TestValidatingWebhookWarnings(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 3*time.Minute)
	c, warns := env.WarningsClient(t)
	dry := client.DryRunAll

	// Until the webhook answers, a create gets no warnings: retry.
	risky := &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "risky"}, Spec: v1alpha1.NodeOversellSpec{
		Ratios: v1alpha1.OversellRatios{CPU: "2", Memory: "1.5"},
	}}
	var got []string
	err := cluster.WaitFor(ctx, bound(60*time.Second), "warnings for a risky NodeOversell", func(ctx context.Context) (bool, error) {
		warns.Take()
		if err := c.Create(ctx, risky.DeepCopy(), dry); err != nil {
			return false, err
		}
		got = warns.Take()
		return len(got) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	expect := func(what string, got []string, want ...string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: warnings %q, want %d", what, got, len(want))
		}
		for i, w := range want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: warning %q lacks %q", what, got[i], w)
			}
		}
		t.Logf("%s: %q", what, got)
	}
	expect("memory ratio 1.5, no nodeSelector", got, "spec.ratios.memory 1.5 is above 1", "spec.nodeSelector is empty: every node")

	calm := risky.DeepCopy()
	calm.Spec.Ratios.Memory = ""
	calm.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "oversell"}}
	if err := c.Create(ctx, calm, dry); err != nil {
		t.Fatal(err)
	}
	expect("cpu only, selected pool", warns.Take())

	fail := calm.DeepCopy()
	fail.Spec.FailurePolicy = v1alpha1.FailurePolicyFail
	err = c.Create(ctx, fail, dry)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.failurePolicy") || !strings.Contains(err.Error(), "must be Ignore") {
		t.Fatalf("NodeOversell failurePolicy Fail: %v", err)
	}
	t.Logf("failurePolicy Fail rejected: %v", err)
	warns.Take()

	// The sample selects namespaces and quotes every pod value.
	si := cluster.SampleInjector(t, "calm-injector")
	if err := c.Create(ctx, si.DeepCopy(), dry); err != nil {
		t.Fatal(err)
	}
	expect("sample SidecarInjector", warns.Take())

	si.Name = "risky-injector"
	si.Spec.NamespaceSelector = nil
	si.Spec.Templates = append(si.Spec.Templates, v1alpha1.NamedTemplate{Name: "unquoted",
		Template: "metadata:\n  labels:\n    team: {{ annotation .ObjectMeta \"team\" \"none\" }}\n"})
	if err := c.Create(ctx, si.DeepCopy(), dry); err != nil {
		t.Fatal(err)
	}
	expect("no namespaceSelector, an unquoted annotation", warns.Take(),
		"failurePolicy Fail with no spec.namespaceSelector",
		`template unquoted:3:13: {{annotation .ObjectMeta "team" "none"}} prints a pod-controlled value without quote`)

	si.Spec.FailurePolicy = v1alpha1.FailurePolicyIgnore
	si.Spec.Templates = si.Spec.Templates[:len(si.Spec.Templates)-1]
	if err := c.Create(ctx, si.DeepCopy(), dry); err != nil {
		t.Fatal(err)
	}
	expect("Ignore, no namespaceSelector", warns.Take())
}
