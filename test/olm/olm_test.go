package olm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	hookwrightv1alpha1 "github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/olmbundle"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

const installNamespace = "hookwright-system"

func TestMain(m *testing.M) {
	// The clients log through controller-runtime; this test reports through t.Logf.
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	// The host binary the uninstall check runs as the manager and the
	// injector (cluster.MustHookwrightBinary).
	cluster.RemoveHookwrightBinary()
	os.Exit(code)
}

// TestInstallAndUpgradeThroughOLM installs the committed bundle/ through a
// real OLM (olm and catalog operators, opm-served file-based catalog, grpc
// CatalogSource, OperatorGroup, Subscription) on a local control plane with
// kwok nodes, then upgrades it to a generated next version that replaces it.
func TestInstallAndUpgradeThroughOLM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bundleDir := filepath.Join(root, "bundle")

	start := time.Now()
	c, err := cluster.New(ctx, cluster.Options{
		// No CRDs from config/: OLM must create them from the bundle.
		CRDDirectoryPaths: []string{},
		ControllerManager: true,
		Scheduler:         true,
		Nodes:             []cluster.NodeSpec{{Name: "kwok-a"}, {Name: "kwok-b"}},
		Logf:              t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	o, err := olm.Start(ctx, c, olm.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Stop)
	t.Logf("cluster and OLM up in %s", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	in, err := o.InstallBundle(ctx, bundleDir, olm.InstallOptions{Namespace: installNamespace})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("installed %s (installplan %s) in %s", in.CSV(), in.InstallPlans[0], time.Since(start).Round(time.Millisecond))
	csv := checkInstalled(ctx, t, o, in)
	// The Helm chart refuses to install over it, naming the CSV.
	checkHelmRefused(ctx, t, c, filepath.Join(root, "dist/chart"),
		"hookwright is already installed by OLM: ClusterServiceVersion "+installNamespace+"/"+in.CSV())

	// CRs created before the upgrade must survive it.
	si := &hookwrightv1alpha1.SidecarInjector{}
	if err := cluster.LoadSample("admission_v1alpha1_sidecarinjector.yaml", si); err != nil {
		t.Fatal(err)
	}
	si.Namespace = "default"
	no := &hookwrightv1alpha1.NodeOversell{}
	if err := cluster.LoadSample("admission_v1alpha1_nodeoversell.yaml", no); err != nil {
		t.Fatal(err)
	}
	crs := []client.Object{si, no}
	for _, cr := range crs {
		if err := o.Client.Create(ctx, cr); err != nil {
			t.Fatalf("create %T %s: %v", cr, cr.GetName(), err)
		}
	}

	next, err := version.ParseSemantic(csv.Spec.Version.String())
	if err != nil {
		t.Fatalf("csv %s version %q: %v", csv.Name, csv.Spec.Version.String(), err)
	}
	nextVersion := fmt.Sprintf("%d.%d.%d", next.Major(), next.Minor(), next.Patch()+1)
	upDir := filepath.Join(t.TempDir(), "bundle")
	derived, err := olmbundle.Derive(bundleDir, upDir, olmbundle.Options{Version: nextVersion})
	if err != nil {
		t.Fatal(err)
	}
	oldName, newName := derived.OldName, derived.NewName
	if oldName != in.CSV() {
		t.Fatalf("bundle CSV %s, installed %s", oldName, in.CSV())
	}
	start = time.Now()
	if err := in.Upgrade(ctx, upDir); err != nil {
		t.Fatal(err)
	}
	t.Logf("upgraded %s -> %s (installplan %s) in %s", oldName, newName, in.InstallPlans[1], time.Since(start).Round(time.Millisecond))
	if in.CSV() != newName || in.InstallPlans[0] == in.InstallPlans[1] {
		t.Fatalf("after upgrade: csv %s, installplans %v", in.CSV(), in.InstallPlans)
	}
	up := checkInstalled(ctx, t, o, in)
	if up.Spec.Replaces != oldName {
		t.Errorf("csv %s replaces %q, want %q", up.Name, up.Spec.Replaces, oldName)
	}
	for _, cr := range crs {
		got := cr.DeepCopyObject().(client.Object)
		if err := o.Client.Get(ctx, client.ObjectKeyFromObject(cr), got); err != nil {
			t.Errorf("%T %s after upgrade: %v", cr, cr.GetName(), err)
		} else if got.GetUID() != cr.GetUID() {
			t.Errorf("%T %s recreated by the upgrade (uid %s, was %s)", cr, cr.GetName(), got.GetUID(), cr.GetUID())
		}
	}

	// Uninstall with the CRs kept: nothing is left that can refuse an admission.
	checkUninstallKeepsCRs(ctx, t, o, in, si, no)
}

// checkInstalled asserts what OLM made from the installed CSV: the owned
// CRDs (Established), the Deployments with Ready Pods on kwok nodes, the
// ServiceAccounts, and RBAC that grants every rule of the CSV's permissions
// (namespaced) and clusterPermissions (cluster-wide), checked with
// SubjectAccessReviews as the ServiceAccount.
func checkInstalled(ctx context.Context, t *testing.T, o *olm.OLM, in *olm.Installation) *operatorsv1alpha1.ClusterServiceVersion {
	t.Helper()
	csv := &operatorsv1alpha1.ClusterServiceVersion{}
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: in.CSV()}, csv); err != nil {
		t.Fatal(err)
	}
	if csv.Status.Phase != operatorsv1alpha1.CSVPhaseSucceeded {
		t.Fatalf("csv %s phase %s", csv.Name, csv.Status.Phase)
	}
	ip := &operatorsv1alpha1.InstallPlan{}
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: in.InstallPlans[len(in.InstallPlans)-1]}, ip); err != nil {
		t.Fatal(err)
	}
	if ip.Status.Phase != operatorsv1alpha1.InstallPlanPhaseComplete {
		t.Errorf("installplan %s phase %s", ip.Name, ip.Status.Phase)
	}

	owned := csv.Spec.CustomResourceDefinitions.Owned
	if len(owned) == 0 {
		t.Errorf("csv %s owns no CRDs", csv.Name)
	}
	for _, d := range owned {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := o.Client.Get(ctx, client.ObjectKey{Name: d.Name}, crd); err != nil {
			t.Errorf("owned CRD %s: %v", d.Name, err)
			continue
		}
		established := false
		for _, c := range crd.Status.Conditions {
			established = established || (c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue)
		}
		if !established {
			t.Errorf("CRD %s not Established", d.Name)
		}
	}

	strategy := csv.Spec.InstallStrategy.StrategySpec
	if len(strategy.DeploymentSpecs) == 0 {
		t.Fatalf("csv %s has no deployments", csv.Name)
	}
	for _, ds := range strategy.DeploymentSpecs {
		dep := &appsv1.Deployment{}
		key := client.ObjectKey{Namespace: in.Namespace, Name: ds.Name}
		err := cluster.WaitFor(ctx, 5*time.Minute, "deployment "+key.String()+" available", func(ctx context.Context) (bool, error) {
			if err := o.Client.Get(ctx, key, dep); err != nil {
				return false, err
			}
			want := int32(1)
			if dep.Spec.Replicas != nil {
				want = *dep.Spec.Replicas
			}
			return dep.Status.ObservedGeneration == dep.Generation && dep.Status.UpdatedReplicas == want &&
				dep.Status.AvailableReplicas == want && dep.Status.Replicas == want, nil
		})
		if err != nil {
			t.Fatalf("%v; status %+v", err, dep.Status)
		}
		// OLM labels what it creates for a CSV with its owner.
		if dep.Labels["olm.owner"] != csv.Name || dep.Labels["olm.owner.namespace"] != in.Namespace {
			t.Errorf("deployment %s labels %v: not owned by csv %s", dep.Name, dep.Labels, csv.Name)
		}
		sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		pods := &corev1.PodList{}
		if err := o.Client.List(ctx, pods, client.InNamespace(in.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || !cluster.PodReady(&p) {
				continue
			}
			node := &corev1.Node{}
			if err := o.Client.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, node); err != nil {
				t.Errorf("pod %s node %q: %v", p.Name, p.Spec.NodeName, err)
				continue
			}
			if node.Annotations[cluster.KwokNodeAnnotation] != "fake" {
				t.Errorf("pod %s runs on %s, not a kwok node", p.Name, node.Name)
			}
			ready++
		}
		if ready < int(*dep.Spec.Replicas) {
			t.Errorf("deployment %s: %d ready pods, want %d", dep.Name, ready, *dep.Spec.Replicas)
		}
		t.Logf("deployment %s: %d/%d pods ready on kwok nodes", dep.Name, ready, *dep.Spec.Replicas)
	}

	checkPermissions := func(perms []operatorsv1alpha1.StrategyDeploymentPermissions, namespace string) {
		for _, p := range perms {
			sa := &corev1.ServiceAccount{}
			if err := o.Client.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: p.ServiceAccountName}, sa); err != nil {
				t.Errorf("serviceaccount %s: %v", p.ServiceAccountName, err)
				continue
			}
			user := "system:serviceaccount:" + in.Namespace + ":" + p.ServiceAccountName
			n := 0
			for _, r := range p.Rules {
				for _, attrs := range ruleAttributes(r, namespace) {
					n++
					sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
						User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + in.Namespace},
						ResourceAttributes: attrs,
					}}
					if err := o.Client.Create(ctx, sar); err != nil {
						t.Fatal(err)
					}
					if !sar.Status.Allowed {
						t.Errorf("%s may not %s %s.%s (namespace %q, name %q): %s", user, attrs.Verb, attrs.Resource, attrs.Group, attrs.Namespace, attrs.Name, sar.Status.Reason)
					}
				}
			}
			scope := "cluster-wide"
			if namespace != "" {
				scope = "in " + namespace
			}
			t.Logf("serviceaccount %s: %d permission checks %s allowed", p.ServiceAccountName, n, scope)
		}
	}
	checkPermissions(strategy.Permissions, in.Namespace)
	checkPermissions(strategy.ClusterPermissions, "")
	return csv
}

// ruleAttributes expands an RBAC rule into one access check per group,
// resource, verb and resource name (wildcards checked as written).
func ruleAttributes(r rbacv1.PolicyRule, namespace string) []*authorizationv1.ResourceAttributes {
	var out []*authorizationv1.ResourceAttributes
	names := r.ResourceNames
	if len(names) == 0 {
		names = []string{""}
	}
	for _, g := range r.APIGroups {
		for _, res := range r.Resources {
			resource, sub := res, ""
			for i := range res {
				if res[i] == '/' {
					resource, sub = res[:i], res[i+1:]
					break
				}
			}
			for _, v := range r.Verbs {
				for _, name := range names {
					out = append(out, &authorizationv1.ResourceAttributes{
						Namespace: namespace, Verb: v, Group: g, Resource: resource, Subresource: sub, Name: name,
					})
				}
			}
		}
	}
	return out
}
