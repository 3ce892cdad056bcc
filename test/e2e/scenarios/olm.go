package scenarios

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

// OLMInstall is scenario 5: the committed bundle/ installs through OLM (olm
// and catalog operators, an opm-served file-based catalog, a grpc
// CatalogSource, an OperatorGroup and a Subscription, test/olm) on the same
// cluster and takes the installation over. config/default's operator is
// removed as `make undeploy` would (but for the CRDs and the Namespace); the
// CSV's Deployment then runs in a real container on SystemNode (the
// bundle's image is ServerImage), and the existing CRs keep working: a
// deleted webhook configuration is recreated by the OLM-installed operator
// and pods are injected.
func OLMInstall(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	// What `make undeploy` would remove, but for the Namespace and the
	// CRDs (which hold the CRs OLM's install takes over).
	for _, u := range e.deployed {
		switch u.GetKind() {
		case "Namespace", "CustomResourceDefinition":
			continue
		}
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(u.GroupVersionKind())
		obj.SetNamespace(u.GetNamespace())
		obj.SetName(u.GetName())
		if err := c.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	if err := cluster.WaitFor(ctx, 2*time.Minute, "config/default's operator pods gone", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := c.Client.List(ctx, &pods, client.InNamespace(OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "manager"})
		return err == nil && len(pods.Items) == 0, err
	}); err != nil {
		return err
	}
	e.deployed = nil
	r.check("config/default's operator (Deployment, RBAC, Services, PDB) removed; its pods are gone")

	start := time.Now()
	o, err := olm.Start(ctx, c, olm.Options{Logf: e.Logf})
	if err != nil {
		return err
	}
	e.olm = o
	r.timing("OLM (olm and catalog operators) started, its CRDs established", time.Since(start), 0)
	start = time.Now()
	in, err := o.InstallBundle(ctx, filepath.Join(root, "bundle"), olm.InstallOptions{Namespace: OperatorNamespace, Timeout: 3 * time.Minute})
	if err != nil {
		return err
	}
	e.olmInstall = in
	r.timing("bundle/ through OLM: catalog, Subscription → CSV Succeeded", time.Since(start), 0)

	const prefix = "hookwright-"
	var opPod string
	if err := cluster.WaitFor(ctx, 2*time.Minute, "the CSV's operator pod run and Ready", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.Client.List(ctx, &pods, client.InNamespace(OperatorNamespace)); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, prefix+"controller-manager-") && p.Spec.NodeName == SystemNode && cluster.PodReady(&p) {
				opPod = p.Name
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	r.check("%s installed (InstallPlan %s Complete, CSV Succeeded); its operator pod %s runs in a real container on %s, Ready by its /readyz",
		in.CSV(), in.InstallPlans[0], opPod, SystemNode)

	name := desired.SidecarKind.BaseName(SampleInjectorName)
	if err := c.Client.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		return err
	}
	took, err := cluster.Poll(ctx, 5*time.Millisecond, 2*time.Minute, "configuration recreated by the OLM-installed operator", func(ctx context.Context) (bool, error) {
		err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &admissionregistrationv1.MutatingWebhookConfiguration{})
		return err == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		return err
	}
	r.timing("OLM-installed operator: deleted configuration recreated (incl. leader election)", took, 0)
	lag, err := injectionWorks(ctx, e, "olm-1")
	if err != nil {
		return err
	}
	r.check("the OLM-installed operator took over the existing CRs: %s recreated, pods injected again %s later", name, lag.Round(time.Millisecond))
	return nil
}
