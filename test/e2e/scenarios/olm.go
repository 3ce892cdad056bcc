package scenarios

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

// OLMInstall is scenario 5: the committed bundle/ installs through OLM (olm
// and catalog operators, an opm-served file-based catalog, a grpc
// CatalogSource, an OperatorGroup and a Subscription, test/olm) on the same
// cluster and takes the installation over. The locally run operator is
// stopped and what stood in for its manifests (config/rbac's objects, the
// webhook Service) removed; the CSV's Deployment then runs on SystemNode
// through the pod runner (the bundle's image is ServerImage), and the
// existing CRs keep working: a deleted webhook configuration is recreated
// by the OLM-installed operator and pods are injected.
func OLMInstall(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	if e.Operator != nil {
		if err := e.Operator.Stop(10 * time.Second); err != nil {
			return err
		}
		e.Operator = nil
	}
	const prefix = "hookwright-"
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: OperatorNamespace, Name: prefix + "controller-manager"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: prefix + "manager-role"}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: prefix + "manager-rolebinding"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: OperatorNamespace, Name: prefix + "leader-election-role"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: OperatorNamespace, Name: prefix + "leader-election-rolebinding"}},
	}
	svc := &corev1.Service{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: desired.DefaultWebhookService}, svc); err == nil {
		c.UnrouteService(svc)
		objs = append(objs, svc)
	}
	for _, o := range objs {
		if err := c.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove %T %s: %w", o, o.GetName(), err)
		}
	}
	r.check("local operator stopped; its config/rbac objects and webhook Service removed")

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
	r.timing("bundle/ through OLM: catalog, Subscription → CSV Succeeded", time.Since(start), 0)

	var opPod string
	if err := cluster.WaitFor(ctx, 2*time.Minute, "the CSV's operator pod run and Ready", func(ctx context.Context) (bool, error) {
		for _, p := range e.Runner.Pods() {
			if p.Namespace == OperatorNamespace && strings.HasPrefix(p.Name, prefix+"controller-manager-") {
				for _, ct := range p.Containers {
					if ct.Ready {
						opPod = p.Name
						return true, nil
					}
				}
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	r.check("%s installed (InstallPlan %s Complete, CSV Succeeded); its operator pod %s runs on %s, Ready by its /readyz",
		in.CSV(), in.InstallPlans[0], opPod, SystemNode)

	name := desired.SidecarKind.BaseName(SampleInjectorName)
	if err := c.Client.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		return err
	}
	took, err := pollUntil(ctx, "configuration recreated by the OLM-installed operator", 2*time.Minute, func(ctx context.Context) (bool, error) {
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
