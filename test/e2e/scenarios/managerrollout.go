package scenarios

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// managerRolloutLoad is the number of loops sending spec changes during
// the operator's rollout, each pausing managerRolloutPause after an answer.
const (
	managerRolloutLoad  = 2
	managerRolloutPause = 20 * time.Millisecond
	// managerRolloutSettle is the answers each loop counts before and
	// after the rollout: the API server then holds connections to the
	// old pods, and has reached the new ones.
	managerRolloutSettle = 50
)

// managerRolloutUnderLoad restarts the operator's Deployment as
// `kubectl rollout restart` does (issue 25: the manager's validating
// webhook through a manager rollout), while loops send server-side
// dry-run spec changes of the sample SidecarInjector. Each is a call of
// the manager's validating webhook (failurePolicy Fail, 5 s; its
// spec-changed matchCondition passes a spec change), answered by the old
// pods while they drain (webhooks/listener, docs/failsafe.md) and by the
// new ones after. It returns when the new pods are Ready, the old ones
// gone and each loop has been answered managerRolloutSettle more times,
// and fails if any change was refused.
func (e *Env) managerRolloutUnderLoad(ctx context.Context, r *Result, replicas int32) error {
	c := e.Cluster.Client
	old, err := e.operatorPodsReady(ctx, replicas)
	if err != nil {
		return err
	}
	calls0, err := e.Cluster.WebhookLatency(ctx, desired.ValidatingWebhookName)
	if err != nil {
		return err
	}
	loads := make([]*admissionLoad, managerRolloutLoad)
	loadCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	start := time.Now()
	for i := range loads {
		l := &admissionLoad{ns: fmt.Sprintf("loop %d", i+1)}
		loads[i] = l
		go func() {
			defer func() { done <- struct{}{} }()
			for n := 0; loadCtx.Err() == nil; n++ {
				// 9 or 11, never the sample's 5: a spec change each time.
				patch := fmt.Appendf(nil, `{"spec":{"timeoutSeconds":%d}}`, 9+2*(n%2))
				si := &v1alpha1.SidecarInjector{}
				si.Name = SampleInjectorName
				err := c.Patch(loadCtx, si, client.RawPatch(types.MergePatchType, patch), client.DryRunAll)
				if loadCtx.Err() != nil {
					return
				}
				l.recordErr(err)
				time.Sleep(managerRolloutPause)
			}
		}()
	}
	ended := false
	end := func() {
		if !ended {
			ended = true
			stop()
			for range loads {
				<-done
			}
		}
	}
	defer end()
	if err := awaitAdmissions(ctx, loads, managerRolloutSettle, "before the operator's rollout"); err != nil {
		return err
	}
	restarted := time.Now()
	if _, _, err := e.RunKubectl(ctx, nil, "rollout", "restart", "deployment/"+OperatorDeployment, "--namespace", OperatorNamespace); err != nil {
		return err
	}
	if err := cluster.WaitFor(ctx, 3*time.Minute, "the operator's old pods gone and new ones Ready", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "manager"}); err != nil {
			return false, err
		}
		ready := 0
		for _, p := range pods.Items {
			if slices.Contains(old, p.Name) {
				return false, nil
			}
			if p.DeletionTimestamp == nil && cluster.PodReady(&p) {
				ready++
			}
		}
		return ready == int(replicas), nil
	}); err != nil {
		return err
	}
	took := time.Since(restarted)
	if err := awaitAdmissions(ctx, loads, managerRolloutSettle, "after the operator's rollout"); err != nil {
		return err
	}
	end()
	ran := time.Since(start)
	var total, failed int64
	errs := ""
	for _, l := range loads {
		total += l.attempted.Load()
		failed += l.failed.Load()
		errs += firstErrors(l)
	}
	calls1, err := e.Cluster.WebhookLatency(ctx, desired.ValidatingWebhookName)
	if err != nil {
		return err
	}
	calls := calls1.Minus(calls0)
	r.timing("kubectl rollout restart of the operator: old pods gone, new ones Ready", took, 0)
	r.check("kubectl rollout restart deployment/%s (%d replicas) under %d dry-run SidecarInjector spec changes in %s (%.0f/s), %d refused%s; the API server's calls of %s meanwhile: %s",
		OperatorDeployment, replicas, total, ran.Round(100*time.Millisecond), float64(total)/ran.Seconds(), failed, errs, desired.ValidatingWebhookName, calls)
	if failed > 0 {
		return fmt.Errorf("%d of %d SidecarInjector spec changes refused during the operator's rollout%s", failed, total, errs)
	}
	if calls.Count < uint64(total) {
		// Each change must have reached the webhook, or the check proves
		// nothing about it.
		return fmt.Errorf("the API server called %s %d times for %d spec changes", desired.ValidatingWebhookName, calls.Count, total)
	}
	return nil
}
