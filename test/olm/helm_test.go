package olm_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

const release = "hookwright"

// helmRun runs bin/helm against c with its own config, cache and data
// directories, and returns its combined output.
func helmRun(ctx context.Context, t *testing.T, c *cluster.Cluster, home string, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(c.Bin, "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm is needed: %v (build it with hack/tools.sh helm)", err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig,
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("helm %s: %v\n%s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	return out.String(), err
}

// kustomizeDefault renders config/default as `make deploy` applies it.
func kustomizeDefault(t *testing.T, root string) []*unstructured.Unstructured {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "config/default"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out
}

// keysOf maps objects to snapshot keys (group, resource, namespace, name).
func keysOf(t *testing.T, c *cluster.Cluster, objs []*unstructured.Unstructured) []olm.ObjectKey {
	t.Helper()
	var out []olm.ObjectKey
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := c.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		out = append(out, olm.ObjectKey{Group: gvk.Group, Resource: m.Resource.Resource, Namespace: o.GetNamespace(), Name: o.GetName()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func keyStrings(ks []olm.ObjectKey) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = k.String()
	}
	return strings.Join(s, "\n")
}

// TestHelmChart installs the generated dist/chart with the real helm on a
// real API server: the install creates exactly the objects config/default
// renders (the namespace aside: the release's), an upgrade applies changed
// values, the uninstall leaves nothing but the kept CRDs, and an install
// over a kustomize install (make deploy) is refused by the chart's check,
// naming it. No node runs the operator's pods: their readiness and the
// samples' are test/e2e's.
func TestHelmChart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "dist/chart")
	home := t.TempDir()
	start := time.Now()
	c, err := cluster.New(ctx, cluster.Options{
		// The chart must bring the CRDs.
		CRDDirectoryPaths: []string{},
		// Deployments make ReplicaSets and Pods, and the garbage
		// collector removes them after the uninstall.
		ControllerManager: true,
		Logf:              t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	t.Logf("cluster up in %s", time.Since(start).Round(time.Millisecond))

	// The release namespace exists before, as with --create-namespace; its
	// default ServiceAccount and root CA ConfigMap are the namespace's.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNamespace}}
	if err := c.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitFor(ctx, time.Minute, "namespace defaults", func(ctx context.Context) (bool, error) {
		var sa corev1.ServiceAccount
		var cm corev1.ConfigMap
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: "default"}, &sa); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		err := c.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: "kube-root-ca.crt"}, &cm)
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	before, err := olm.Snapshot(ctx, c.Config)
	if err != nil {
		t.Fatal(err)
	}

	// What kustomize renders, without the Namespace.
	var rendered []*unstructured.Unstructured
	for _, o := range kustomizeDefault(t, root) {
		if o.GetKind() != "Namespace" {
			rendered = append(rendered, o)
		}
	}
	want := keysOf(t, c, rendered)

	// Install: exactly config/default's objects carry the release.
	start = time.Now()
	if _, err := helmRun(ctx, t, c, home, "install", release, chart, "--namespace", installNamespace); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install in %s", time.Since(start).Round(time.Millisecond))
	after, err := olm.Snapshot(ctx, c.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The Endpoints and EndpointSlices of the chart's Services copy their
	// labels; the endpoint controllers made them, not Helm.
	var got []olm.ObjectKey
	for _, k := range olm.NewObjects(before, after) {
		if k.Resource == "endpoints" || k.Resource == "endpointslices" {
			continue
		}
		if after[k].Labels["app.kubernetes.io/instance"] == release {
			got = append(got, k)
		}
	}
	if keyStrings(got) != keyStrings(want) {
		t.Errorf("helm install created\n%s\nconfig/default renders\n%s", keyStrings(got), keyStrings(want))
	}
	var dep appsv1.Deployment
	depKey := client.ObjectKey{Namespace: installNamespace, Name: "hookwright-controller-manager"}
	if err := c.Client.Get(ctx, depKey, &dep); err != nil {
		t.Fatal(err)
	}
	if dep.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("deployment labels %v, want managed-by Helm", dep.Labels)
	}
	crd := crdMeta("sidecarinjectors.admission.hookwright.io")
	if err := c.Client.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
		t.Fatal(err)
	}
	if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("crd annotations %v, want helm.sh/resource-policy: keep (crds.keep defaults to true)", crd.GetAnnotations())
	}

	// Upgrade with changed values: they reach the objects.
	start = time.Now()
	if _, err := helmRun(ctx, t, c, home, "upgrade", release, chart, "--namespace", installNamespace,
		"--set", "replicas=1", "--set", "resources.limits.memory=300Mi", "--set", "networkPolicy.enabled=true"); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade in %s", time.Since(start).Round(time.Millisecond))
	if err := c.Client.Get(ctx, depKey, &dep); err != nil {
		t.Fatal(err)
	}
	if r := dep.Spec.Replicas; r == nil || *r != 1 {
		t.Errorf("after upgrade replicas %v, want 1", r)
	}
	if m := dep.Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; m.Cmp(resource.MustParse("300Mi")) != 0 {
		t.Errorf("after upgrade memory limit %s, want 300Mi", m.String())
	}
	var np networkingv1.NetworkPolicy
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: "hookwright-webhook-servers"}, &np); err != nil {
		t.Errorf("networkPolicy.enabled=true: %v", err)
	}

	// Uninstall: once the garbage collector has removed the ReplicaSet and
	// Pods, only the kept CRDs remain of everything created since.
	start = time.Now()
	if _, err := helmRun(ctx, t, c, home, "uninstall", release, "--namespace", installNamespace, "--wait"); err != nil {
		t.Fatal(err)
	}
	// The API server's own APIService for the kept CRDs' group goes with them.
	wantLeft := keyStrings([]olm.ObjectKey{
		{Group: "apiregistration.k8s.io", Resource: "apiservices", Name: "v1alpha1.admission.hookwright.io"},
		{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions", Name: "nodeoversells.admission.hookwright.io"},
		{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions", Name: "sidecarinjectors.admission.hookwright.io"},
	})
	var left []olm.ObjectKey
	var lastErr string
	if err := cluster.WaitFor(ctx, 2*time.Minute, "only the kept CRDs left", func(ctx context.Context) (bool, error) {
		now, err := olm.Snapshot(ctx, c.Config)
		if err != nil {
			if err.Error() != lastErr {
				lastErr = err.Error()
				t.Logf("snapshot: %v", err)
			}
			return false, err
		}
		left = olm.NewObjects(before, now)
		return keyStrings(left) == wantLeft, nil
	}); err != nil {
		t.Fatalf("%v: left\n%s", err, keyStrings(left))
	}
	t.Logf("helm uninstall, and the garbage collector done, in %s", time.Since(start).Round(time.Millisecond))

	// A kustomize install (make deploy's objects, applied server-side as
	// kubectl apply --server-side does) refuses a Helm install over it.
	for _, name := range []string{"nodeoversells.admission.hookwright.io", "sidecarinjectors.admission.hookwright.io"} {
		crd := crdMeta(name)
		if err := c.Client.Delete(ctx, crd); err != nil {
			t.Fatal(err)
		}
		if err := cluster.WaitFor(ctx, time.Minute, "crd "+name+" deleted", func(ctx context.Context) (bool, error) {
			err := c.Client.Get(ctx, client.ObjectKeyFromObject(crd), crd)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range rendered {
		if err := c.Client.Patch(ctx, o, client.Apply, client.FieldOwner("kubectl"), client.ForceOwnership); err != nil { //nolint:staticcheck // SSA of unstructured objects
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	checkHelmRefused(ctx, t, c, chart, "hookwright is already installed by kustomize",
		"Deployment "+installNamespace+"/hookwright-controller-manager")
	for i := len(rendered) - 1; i >= 0; i-- {
		if err := c.Client.Delete(ctx, rendered[i]); client.IgnoreNotFound(err) != nil {
			t.Errorf("delete %s %s: %v", rendered[i].GetKind(), rendered[i].GetName(), err)
		}
	}
	if err := c.Client.Delete(ctx, ns); err != nil {
		t.Error(fmt.Errorf("delete namespace: %w", err))
	}
}

// crdMeta is CRD name as an unstructured object (the cluster's client has
// no apiextensions scheme).
func crdMeta(name string) *unstructured.Unstructured {
	m := &unstructured.Unstructured{}
	m.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	m.SetName(name)
	return m
}

// checkHelmRefused runs helm install of chart into installNamespace and
// fails t unless it is refused with every string of want in its output
// and leaves no release.
func checkHelmRefused(ctx context.Context, t *testing.T, c *cluster.Cluster, chart string, want ...string) {
	t.Helper()
	home := t.TempDir()
	out, err := helmRun(ctx, t, c, home, "install", release, chart, "--namespace", installNamespace)
	if err == nil {
		t.Fatal("helm install over another install succeeded")
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("refused helm install: output lacks %q", w)
		}
	}
	if st, err := helmRun(ctx, t, c, home, "status", release, "--namespace", installNamespace); err == nil || !strings.Contains(st, "not found") {
		t.Errorf("the refused install left release %s: %v", release, err)
	}
}
