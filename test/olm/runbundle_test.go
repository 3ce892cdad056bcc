package olm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hookwrightv1alpha1 "github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certsource"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/ociimage"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

// TestRunBundleOnRealNode is what the README tells a user to run, end to
// end, on a real node (kubelet, containerd, runc) with OLM v0.33.0:
//
//   - the bundle image (bundle/ with bundle.Dockerfile's labels), a 0.1.1
//     bundle that replaces it, an empty file-based catalog as the index
//     image, the operator image and OLM's and operator-sdk's pod images are
//     built without Docker and pushed to a registry on 127.0.0.1;
//   - `operator-sdk run bundle` ends with the CSV Succeeded: its registry
//     pod, OLM's bundle unpack Job and the operator Deployment run in real
//     containers on the real node, the operator's pods Running and Ready;
//   - a SidecarInjector and a NodeOversell (admitted by the operator's
//     validating webhook) survive `operator-sdk run bundle-upgrade` to
//     0.1.1;
//   - `operator-sdk cleanup hookwright` leaves no object of any kind behind
//     that was not there before run bundle (CSVs, Subscriptions,
//     CatalogSources, InstallPlans, OperatorGroups, pods, Jobs, ConfigMaps,
//     Deployments, Services, Secrets, Leases, webhook configurations, CRDs,
//     ClusterRoles and bindings, ...: every listable resource), Events
//     aside.
//
// Image names: operator-sdk reads the bundle and index images itself, on
// the host, over HTTPS only (see ociimage.Registry.StartTLS), so both are
// named after the registry's TLS address with its certificate in
// SSL_CERT_FILE. The same names reach the node's containerd (registry pod,
// unpack Job), which pulls them from the plain listener
// (RealNodeSpec.RegistryAliases). No pod pulls an image itself: with a
// file-based index image the registry pod only serves the catalog
// operator-sdk rendered on the host (ConfigMaps), and OLM's unpack Job
// gets the bundle's files from a container of the bundle image.
func TestRunBundleOnRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin")
	// A missing prerequisite fails, naming it.
	if err := cluster.RealNodePrerequisites(bin); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bin, "operator-sdk")); err != nil {
		t.Fatalf("bin/operator-sdk (make tool-operator-sdk): %v", err)
	}
	work := t.TempDir()

	reg, err := ociimage.StartRegistry("", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	if err := reg.StartTLS(); err != nil {
		t.Fatal(err)
	}
	bundleRef := func(v string) string { return reg.TLSAddr + "/hookwright-bundle:v" + v }
	imgs := buildRunBundleImages(ctx, t, root, work, reg)
	start := time.Now()
	if err := reg.Push(ctx, imgs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: %d images pushed to %s in %s", len(imgs), reg.Addr, time.Since(start).Round(time.Millisecond))
	index, err := ociimage.LocalReference(reg.TLSAddr, ociimage.IndexName)
	if err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	c, err := cluster.New(ctx, cluster.Options{
		// No CRDs from config/: OLM creates them from the bundle.
		CRDDirectoryPaths: []string{},
		ControllerManager: true,
		Scheduler:         true,
		// In-cluster API access for the operator and OLM's unpack Job.
		ServiceAccountTokens: true,
		Logf:                 t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
		for _, l := range c.Leaks() {
			t.Errorf("leak: %s", l)
		}
	})
	node, err := c.StartRealNode(ctx, cluster.RealNodeSpec{
		Name: "olm-node", Registry: reg.Addr, RegistryAliases: []string{reg.TLSAddr},
	})
	if err != nil {
		t.Fatal(err)
	}
	o, err := olm.Start(ctx, c, olm.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Stop)
	t.Logf("cluster, real node and OLM up in %s", time.Since(start).Round(time.Millisecond))
	if _, err := c.CreateNamespace(ctx, installNamespace, nil); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitFor(ctx, time.Minute, "ServiceAccount "+installNamespace+"/default", func(ctx context.Context) (bool, error) {
		err := o.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	// The kubelet's node Lease appears shortly after the node is Ready.
	if err := cluster.WaitFor(ctx, time.Minute, "node Lease of "+node.Name, func(ctx context.Context) (bool, error) {
		err := o.Client.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node.Name}, &coordinationv1.Lease{})
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	before, err := olm.Snapshot(ctx, c.Config)
	if err != nil {
		t.Fatal(err)
	}

	caFile, err := olm.WriteCAFile(work, reg.CAPEM)
	if err != nil {
		t.Fatal(err)
	}
	sdk := &olm.SDK{Bin: filepath.Join(bin, "operator-sdk"), Kubeconfig: c.Kubeconfig, Dir: filepath.Join(work, "sdk"), CAFile: caFile, Logf: t.Logf}
	failWithLogs := func(err error) {
		t.Helper()
		t.Fatalf("%v\n%s%s", err, podReport(ctx, o), o.Logs(4000))
	}

	start = time.Now()
	if _, err := sdk.Run(ctx, "run", "bundle", bundleRef("0.1.0"), "--index-image", index.String(),
		"--namespace", installNamespace, "--install-mode", "AllNamespaces", "--timeout", "15m"); err != nil {
		failWithLogs(err)
	}
	runTook := time.Since(start)
	csv := checkRunning(ctx, t, o, node, "hookwright.v0.1.0")
	t.Logf("figure: operator-sdk run bundle -> CSV Succeeded %s (CatalogSource created -> CSV Succeeded %s)",
		runTook.Round(time.Millisecond), succeededAfterCatalog(ctx, t, o, csv).Round(time.Second))

	// The registry pod operator-sdk made runs on the real node and is what
	// the catalog operator (on the host, through the node's pod route)
	// reads the catalog from.
	cs := &operatorsv1alpha1.CatalogSource{}
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: "hookwright-catalog"}, cs); err != nil {
		t.Fatal(err)
	}
	regPod := &corev1.Pod{}
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: cs.Annotations["operators.operatorframework.io/registry-pod-name"]}, regPod); err != nil {
		t.Fatalf("registry pod of catalog %s: %v", cs.Name, err)
	}
	if regPod.Spec.NodeName != node.Name || cs.Spec.Address != regPod.Status.PodIP+":50051" || !inRealContainers(regPod) {
		t.Errorf("registry pod %s on %q ip %s, catalog address %q", regPod.Name, regPod.Spec.NodeName, regPod.Status.PodIP, cs.Spec.Address)
	}
	t.Logf("registry pod %s runs %s on %s; catalog address %s", regPod.Name, regPod.Spec.Containers[0].Image, node.Name, cs.Spec.Address)

	// CRs created before the upgrade, through the operator's validating
	// webhook (retried: its configuration appears once it has a certificate).
	si := &hookwrightv1alpha1.SidecarInjector{}
	if err := cluster.LoadSample("admission_v1alpha1_sidecarinjector.yaml", si); err != nil {
		t.Fatal(err)
	}
	no := &hookwrightv1alpha1.NodeOversell{}
	if err := cluster.LoadSample("admission_v1alpha1_nodeoversell.yaml", no); err != nil {
		t.Fatal(err)
	}
	crs := []client.Object{si, no}
	for _, cr := range crs {
		var last error
		if err := cluster.WaitFor(ctx, 3*time.Minute, fmt.Sprintf("create %T %s", cr, cr.GetName()), func(ctx context.Context) (bool, error) {
			last = o.Client.Create(ctx, cr)
			return last == nil, nil
		}); err != nil {
			failWithLogs(fmt.Errorf("%w: %v", err, last))
		}
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := o.Client.Get(ctx, client.ObjectKey{Name: desired.ValidatingConfigName}, vwc); err != nil {
		t.Fatal(err)
	}
	if len(vwc.OwnerReferences) != len(certsource.InstallationCRDs) {
		t.Errorf("%s owner references %v, want the CRDs %v", vwc.Name, vwc.OwnerReferences, certsource.InstallationCRDs)
	}

	start = time.Now()
	if _, err := sdk.Run(ctx, "run", "bundle-upgrade", bundleRef("0.1.1"), "--namespace", installNamespace, "--timeout", "15m"); err != nil {
		failWithLogs(err)
	}
	t.Logf("figure: operator-sdk run bundle-upgrade -> CSV Succeeded %s", time.Since(start).Round(time.Millisecond))
	up := checkRunning(ctx, t, o, node, "hookwright.v0.1.1")
	if up.Spec.Replaces != csv.Name {
		t.Errorf("csv %s replaces %q, want %q", up.Name, up.Spec.Replaces, csv.Name)
	}
	if err := cluster.WaitFor(ctx, 5*time.Minute, "csv "+csv.Name+" replaced", func(ctx context.Context) (bool, error) {
		err := o.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: csv.Name}, &operatorsv1alpha1.ClusterServiceVersion{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		t.Error(err)
	}
	for _, cr := range crs {
		got := cr.DeepCopyObject().(client.Object)
		if err := o.Client.Get(ctx, client.ObjectKeyFromObject(cr), got); err != nil {
			t.Errorf("%T %s after upgrade: %v", cr, cr.GetName(), err)
		} else if got.GetUID() != cr.GetUID() {
			t.Errorf("%T %s recreated by the upgrade (uid %s, was %s)", cr, cr.GetName(), got.GetUID(), cr.GetUID())
		}
	}

	start = time.Now()
	if _, err := sdk.Run(ctx, "cleanup", "hookwright", "--namespace", installNamespace, "--timeout", "5m"); err != nil {
		failWithLogs(err)
	}
	t.Logf("figure: operator-sdk cleanup %s", time.Since(start).Round(time.Millisecond))
	// The garbage collector and OLM remove dependents after cleanup returns.
	// OLM's Operator object for the package (operators.coreos.com/v1
	// Operator <package>.<namespace>) outlives every uninstall: OLM's
	// operator controller creates it, re-creates it on deletion while any
	// object carries its component label, and never deletes it
	// (pkg/controller/operators/operator_controller.go), and operator-sdk
	// cleanup does not delete it (internal/olm/operator/uninstall.go). So
	// once nothing else is left and no object carries that label, it is
	// deleted as OLM's uninstall documentation says, and stays deleted.
	operatorKey := olm.ObjectKey{Group: "operators.coreos.com", Resource: "operators", Name: "hookwright." + installNamespace}
	componentLabel := "operators.coreos.com/hookwright." + installNamespace
	var left, labelled []olm.ObjectKey
	var after map[olm.ObjectKey]olm.ObjectInfo
	done := func(ctx context.Context, allow map[olm.ObjectKey]bool) (bool, error) {
		snap, err := olm.Snapshot(ctx, c.Config)
		if err != nil {
			return false, err
		}
		after = snap
		left = nil
		for _, k := range olm.NewObjects(before, after) {
			if !allow[k] {
				left = append(left, k)
			}
		}
		labelled = olm.Labelled(after, componentLabel)
		return len(left) == 0 && len(labelled) == 0, nil
	}
	report := func(err error) {
		t.Helper()
		var names []string
		for _, k := range append(left, labelled...) {
			names = append(names, k.String()+" ("+after[k].String()+")")
		}
		t.Errorf("%v: left after operator-sdk cleanup, or labelled %s:\n  %s", err, componentLabel, strings.Join(names, "\n  "))
	}
	if err := cluster.WaitFor(ctx, 3*time.Minute, "nothing left of the installation but OLM's Operator", func(ctx context.Context) (bool, error) {
		return done(ctx, map[olm.ObjectKey]bool{operatorKey: true})
	}); err != nil {
		report(err)
	}
	opObj := &operatorsv1.Operator{ObjectMeta: metav1.ObjectMeta{Name: operatorKey.Name}}
	if err := o.Client.Delete(ctx, opObj); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete OLM's Operator %s: %v", operatorKey.Name, err)
	}
	if err := cluster.WaitFor(ctx, time.Minute, "nothing left of the installation", func(ctx context.Context) (bool, error) {
		return done(ctx, nil)
	}); err != nil {
		report(err)
	}
	t.Logf("cleanup: nothing new left among %d objects of %d kinds listed before run bundle, %s after cleanup started", len(before), len(kinds(before)), time.Since(start).Round(time.Millisecond))
}

// buildRunBundleImages builds what the test pushes, timing each set: the
// operator image (the CSV's), the olm set (the 0.1.0 bundle as
// <registry>/hookwright-bundle:v0.1.0, opm, the empty index, OLM's util
// image, the decompression image) and the 0.1.1 bundle.
func buildRunBundleImages(ctx context.Context, t *testing.T, root, work string, reg *ociimage.Registry) []ociimage.Named {
	t.Helper()
	opts := ociimage.Options{Root: root, BinDir: filepath.Join(work, "images"), BundleName: reg.Addr + "/hookwright-bundle:v0.1.0"}
	var imgs []ociimage.Named
	for _, set := range []string{ociimage.SetOperator, ociimage.SetOLM} {
		start := time.Now()
		got, err := ociimage.Build(ctx, opts, set)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("figure: image set %s (%d images) built in %s", set, len(got), time.Since(start).Round(time.Millisecond))
		imgs = append(imgs, got...)
	}
	upDir := filepath.Join(work, "bundle-0.1.1")
	start := time.Now()
	oldName, newName, err := olm.NewBundleVersion(filepath.Join(root, "bundle"), upDir, "0.1.1")
	if err != nil {
		t.Fatal(err)
	}
	up, err := ociimage.Bundle(runtime.GOARCH, upDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: bundle image %s (replaces %s) built in %s", newName, oldName, time.Since(start).Round(time.Millisecond))
	return append(imgs, ociimage.Named{Name: reg.Addr + "/hookwright-bundle:v0.1.1", Image: up})
}

// checkRunning asserts the CSV is Succeeded and each of its Deployments
// has all its pods Running and Ready in real containers on node.
func checkRunning(ctx context.Context, t *testing.T, o *olm.OLM, node *cluster.RealNode, name string) *operatorsv1alpha1.ClusterServiceVersion {
	t.Helper()
	csv := &operatorsv1alpha1.ClusterServiceVersion{}
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: name}, csv); err != nil {
		t.Fatal(err)
	}
	if csv.Status.Phase != operatorsv1alpha1.CSVPhaseSucceeded {
		t.Fatalf("csv %s phase %s: %s", csv.Name, csv.Status.Phase, csv.Status.Message)
	}
	for _, ds := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		dep := &appsv1.Deployment{}
		key := client.ObjectKey{Namespace: installNamespace, Name: ds.Name}
		var pods []corev1.Pod
		err := cluster.WaitFor(ctx, 5*time.Minute, "deployment "+key.String()+" rolled out on "+node.Name, func(ctx context.Context) (bool, error) {
			if err := o.Client.Get(ctx, key, dep); err != nil {
				return false, err
			}
			want := int32(1)
			if dep.Spec.Replicas != nil {
				want = *dep.Spec.Replicas
			}
			sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
			if err != nil {
				return false, cluster.Permanent(err)
			}
			list := &corev1.PodList{}
			if err := o.Client.List(ctx, list, client.InNamespace(installNamespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return false, err
			}
			pods = list.Items
			return dep.Status.ObservedGeneration == dep.Generation && dep.Status.UpdatedReplicas == want &&
				dep.Status.AvailableReplicas == want && dep.Status.Replicas == want && int32(len(pods)) == want, nil
		})
		if err != nil {
			t.Fatalf("%v; status %+v", err, dep.Status)
		}
		if dep.Labels["olm.owner"] != csv.Name {
			t.Errorf("deployment %s labels %v: not owned by csv %s", dep.Name, dep.Labels, csv.Name)
		}
		for _, p := range pods {
			if p.Spec.NodeName != node.Name || p.Status.Phase != corev1.PodRunning || !podReady(&p) || !inRealContainers(&p) {
				t.Errorf("pod %s: node %q phase %s ready %v statuses %+v", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p), p.Status.ContainerStatuses)
				continue
			}
			t.Logf("pod %s Running and Ready on %s (%s, %s)", p.Name, node.Name, p.Status.PodIP, p.Status.ContainerStatuses[0].ContainerID)
		}
	}
	return csv
}

// inRealContainers: every container of p runs in containerd (the
// kubelet reports containerd:// IDs).
func inRealContainers(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if !strings.HasPrefix(s.ContainerID, "containerd://") || s.State.Running == nil {
			return false
		}
	}
	return true
}

// succeededAfterCatalog is the time from the CatalogSource's creation to
// the CSV's Succeeded condition.
func succeededAfterCatalog(ctx context.Context, t *testing.T, o *olm.OLM, csv *operatorsv1alpha1.ClusterServiceVersion) time.Duration {
	t.Helper()
	cs := &operatorsv1alpha1.CatalogSource{}
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: installNamespace, Name: "hookwright-catalog"}, cs); err != nil {
		t.Fatal(err)
	}
	for _, c := range csv.Status.Conditions {
		if c.Phase == operatorsv1alpha1.CSVPhaseSucceeded {
			return c.LastTransitionTime.Sub(cs.CreationTimestamp.Time)
		}
	}
	return 0
}

// podReport lists the install namespace's pods with their phase and
// waiting reasons, for a failure message.
func podReport(ctx context.Context, o *olm.OLM) string {
	list := &corev1.PodList{}
	if err := o.Client.List(ctx, list, client.InNamespace(installNamespace)); err != nil {
		return "list pods: " + err.Error() + "\n"
	}
	var b strings.Builder
	for _, p := range list.Items {
		fmt.Fprintf(&b, "pod %s node %q phase %s:", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case s.State.Waiting != nil:
				fmt.Fprintf(&b, " %s waiting %s %s;", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
			case s.State.Terminated != nil:
				fmt.Fprintf(&b, " %s terminated %s (%d);", s.Name, s.State.Terminated.Reason, s.State.Terminated.ExitCode)
			default:
				fmt.Fprintf(&b, " %s running ready=%v;", s.Name, s.Ready)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func kinds(objs map[olm.ObjectKey]olm.ObjectInfo) map[string]bool {
	out := map[string]bool{}
	for k := range objs {
		out[k.Group+"/"+k.Resource] = true
	}
	return out
}
