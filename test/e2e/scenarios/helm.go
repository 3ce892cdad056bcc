package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// The Helm scenario's objects.
const (
	helmRelease = "hookwright"
	// helmNamespace is labelled for the sample's injection.
	helmNamespace = "lab-helm"
	// helmIgnoreWithin is issue 25's bound for the webhook configurations
	// to fail open once the operator is uninstalled with CRs kept: a
	// figure, the wait itself is longer.
	helmIgnoreWithin = 60 * time.Second
)

// Helm is the chart's scenario (issues 26 and 25), run by make test on a
// stack of its own (test/e2e/standalone), not by the demo: the demo's
// tools do not include helm. On the real node, dist/chart replaces
// config/default's install: the samples are removed and config/default is
// deleted as `make undeploy` does; `helm install` runs the operator pods
// on SystemNode; the samples applied again become Ready (their servers
// answer the API server) and inject a pod; `kubectl rollout restart` of
// the operator refuses none of the SidecarInjector spec changes sent
// meanwhile (managerRolloutUnderLoad); `helm upgrade --set replicas=1`
// rolls the operator to one replica with the samples still
// Ready; `helm uninstall` with the SidecarInjector kept makes every
// hookwright webhook configuration fail open (the injector's server
// switches them: the release's RBAC goes before the operator could,
// docs/failsafe.md), so pods in the injector's scope are
// admitted with no operator running, and leaves nothing of the release
// but the CRDs (crds.keep). Everything it made is removed at its end.
func Helm(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster.Client
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	chart := filepath.Join(root, "dist", "chart")
	home, err := os.MkdirTemp(e.Cluster.Dir, "helm-")
	if err != nil {
		return err
	}
	helm := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(e.Cluster.Bin, "helm"), args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Cluster.Kubeconfig,
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_DATA_HOME="+filepath.Join(home, "data"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
		}
		return out.String(), nil
	}
	defer e.cleanHelm(context.Background(), helm)

	start := time.Now()
	if err := e.undeployKustomize(ctx); err != nil {
		return err
	}
	r.timing("samples and config/default deleted, operator pods gone", time.Since(start), 0)
	r.check("samples deleted, then config/default deleted as make undeploy does (CRDs included)")

	start = time.Now()
	if _, err := helm("install", helmRelease, chart, "--namespace", OperatorNamespace, "--wait", "--timeout", "5m"); err != nil {
		return err
	}
	opPods, err := e.operatorPodsReady(ctx, 2)
	if err != nil {
		return err
	}
	r.timing("helm install dist/chart: operator Deployment available", time.Since(start), 0)
	r.check("helm install %s dist/chart: operator pods %s Ready on %s", helmRelease, strings.Join(opPods, ", "), SystemNode)

	start = time.Now()
	if _, err := e.applySamples(ctx); err != nil {
		return err
	}
	r.timing("samples applied → Ready, their Services with ready endpoints", time.Since(start), 0)
	if _, _, err := e.RunKubectl(ctx, nil, "create", "namespace", helmNamespace); err != nil {
		return err
	}
	if _, _, err := e.RunKubectl(ctx, nil, "label", "namespace", helmNamespace, "sidecar-injection=enabled"); err != nil {
		return err
	}
	p, err := dryRunIn(ctx, e, helmNamespace, "helm-web")
	if err != nil {
		return err
	}
	if err := injectedOnce(p); err != nil {
		return err
	}
	r.check("samples Ready under the Helm install; a dry-run pod in %s injected", helmNamespace)

	if err := e.managerRolloutUnderLoad(ctx, r, 2); err != nil {
		return err
	}

	start = time.Now()
	if _, err := helm("upgrade", helmRelease, chart, "--namespace", OperatorNamespace, "--reuse-values", "--set", "replicas=1", "--wait", "--timeout", "5m"); err != nil {
		return err
	}
	if _, err := e.operatorPodsReady(ctx, 1); err != nil {
		return err
	}
	if err := e.WaitReady(ctx, 3*time.Minute); err != nil {
		return err
	}
	r.timing("helm upgrade --set replicas=1: one operator pod, samples Ready", time.Since(start), 0)
	r.check("helm upgrade --reuse-values --set replicas=1: the operator Deployment runs 1 replica; the samples stay Ready")

	// The NodeOversell's finalizer needs the operator: it goes first.
	if err := deleteAndAwait(ctx, c, &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: SampleOversellName}}); err != nil {
		return err
	}
	manifest, err := helm("get", "manifest", helmRelease, "--namespace", OperatorNamespace)
	if err != nil {
		return err
	}
	manifestFile := filepath.Join(home, "manifest.yaml")
	if err := os.WriteFile(manifestFile, []byte(manifest), 0o600); err != nil {
		return err
	}
	start = time.Now()
	if _, err := helm("uninstall", helmRelease, "--namespace", OperatorNamespace, "--wait", "--timeout", "5m"); err != nil {
		return err
	}
	var open string
	_, err = cluster.Poll(ctx, 100*time.Millisecond, 5*time.Minute, "every hookwright webhook configuration Ignore or gone", func(ctx context.Context) (bool, error) {
		var l admissionregistrationv1.MutatingWebhookConfigurationList
		if err := c.List(ctx, &l, client.HasLabels{desired.LabelInstance}); err != nil {
			return false, err
		}
		var states []string
		for _, m := range l.Items {
			for _, w := range m.Webhooks {
				if ptr.Deref(w.FailurePolicy, admissionregistrationv1.Fail) != admissionregistrationv1.Ignore {
					open = m.Name + "/" + w.Name + " still Fail"
					return false, nil
				}
				states = append(states, m.Name+"/"+w.Name+" Ignore")
			}
		}
		open = strings.Join(states, ", ")
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, open)
	}
	r.timing("helm uninstall with the SidecarInjector kept: every hookwright webhook configuration Ignore or gone", time.Since(start), helmIgnoreWithin)
	p, err = dryRunIn(ctx, e, helmNamespace, "helm-web-after")
	if err != nil {
		return fmt.Errorf("pod create in the kept injector's scope with no operator: %w", err)
	}
	r.check("no operator running: webhook configurations %s; a dry-run pod in %s admitted (%d containers)", open, helmNamespace, len(p.Spec.Containers))
	left, _, err := e.RunKubectl(ctx, nil, "get", "-f", manifestFile, "--ignore-not-found", "-o", "name")
	if err != nil {
		return err
	}
	for _, l := range strings.Fields(left) {
		if !strings.HasPrefix(l, "customresourcedefinition.apiextensions.k8s.io/") {
			return fmt.Errorf("helm uninstall left %s", l)
		}
	}
	r.check("helm uninstall left of the release only the kept CRDs: %s", strings.Join(strings.Fields(left), " "))
	return nil
}

// undeployKustomize removes the samples and then what deployOperator
// applied, as `make undeploy` does: custom resources first (the
// NodeOversell's finalizer needs the operator), then config/default, CRDs
// included, but for the Namespace (the release's).
func (e *Env) undeployKustomize(ctx context.Context) error {
	c := e.Cluster.Client
	if err := deleteAndAwait(ctx, c, &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: SampleOversellName}}); err != nil {
		return err
	}
	var sis v1alpha1.SidecarInjectorList
	if err := c.List(ctx, &sis); err != nil {
		return err
	}
	for i := range sis.Items {
		if err := deleteAndAwait(ctx, c, &sis.Items[i]); err != nil {
			return err
		}
	}
	for _, u := range e.deployed {
		if u.GetKind() == "Namespace" {
			continue
		}
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(u.GroupVersionKind())
		obj.SetNamespace(u.GetNamespace())
		obj.SetName(u.GetName())
		if err := deleteAndAwait(ctx, c, obj); err != nil {
			return err
		}
	}
	e.deployed = nil
	return cluster.WaitFor(ctx, 2*time.Minute, "config/default's operator pods gone", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := c.List(ctx, &pods, client.InNamespace(OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "manager"})
		return err == nil && len(pods.Items) == 0, err
	})
}

// operatorPodsReady waits until the operator Deployment has n replicas,
// all updated and Ready on SystemNode, and returns their names.
func (e *Env) operatorPodsReady(ctx context.Context, n int32) ([]string, error) {
	var names []string
	err := cluster.WaitFor(ctx, 3*time.Minute, fmt.Sprintf("%d operator pods Ready on %s", n, SystemNode), func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: OperatorDeployment}, d); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if d.Status.ObservedGeneration != d.Generation || ptr.Deref(d.Spec.Replicas, 1) != n || d.Status.UpdatedReplicas != n ||
			d.Status.ReadyReplicas != n || d.Status.Replicas != n {
			return false, nil
		}
		var pods corev1.PodList
		if err := e.Cluster.Client.List(ctx, &pods, client.InNamespace(OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "manager"}); err != nil {
			return false, err
		}
		names = names[:0]
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Spec.NodeName == SystemNode && cluster.PodReady(&p) {
				names = append(names, p.Name)
			}
		}
		return len(names) == int(n), nil
	})
	return names, err
}

// deleteAndAwait deletes obj (foreground) and waits until it is gone.
func deleteAndAwait(ctx context.Context, c client.Client, obj client.Object) error {
	if err := c.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("delete %T %s: %w", obj, obj.GetName(), err)
	}
	return cluster.WaitFor(ctx, 3*time.Minute, fmt.Sprintf("%T %s gone", obj, obj.GetName()), func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// cleanHelm removes what the Helm scenario made, whatever step it
// stopped at: the release, the kept SidecarInjectors (no finalizer) with
// their servers, the namespace and the CRDs.
func (e *Env) cleanHelm(ctx context.Context, helm func(...string) (string, error)) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c := e.Cluster.Client
	if _, err := helm("status", helmRelease, "--namespace", OperatorNamespace); err == nil {
		// The NodeOversell's finalizer needs the operator: it goes first.
		_ = deleteAndAwait(ctx, c, &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: SampleOversellName}})
		_, _ = helm("uninstall", helmRelease, "--namespace", OperatorNamespace, "--wait", "--timeout", "2m")
	}
	var sis v1alpha1.SidecarInjectorList
	if err := c.List(ctx, &sis); err == nil {
		for i := range sis.Items {
			_ = deleteAndAwait(ctx, c, &sis.Items[i])
		}
	}
	_ = deleteAndAwait(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: helmNamespace}})
	for _, crd := range []string{"sidecarinjectors.admission.hookwright.io", "nodeoversells.admission.hookwright.io"} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		u.SetName(crd)
		_ = deleteAndAwait(ctx, c, u)
	}
}
