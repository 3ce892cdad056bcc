package olm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hookwrightv1alpha1 "github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

// saKubeconfig writes a kubeconfig that acts as ServiceAccount ns/name,
// with the groups the token authenticator gives it, so a local process
// has exactly the RBAC OLM granted that account.
func saKubeconfig(t *testing.T, c *cluster.Cluster, ns, name string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + ns + ":" + name
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// startLocal runs `hookwright` with a container's args and env (the
// downward API fields filled from pod) plus local overrides (later flags
// win) and waits until its /readyz on probe answers 200.
func startLocal(ctx context.Context, t *testing.T, name string, ctr corev1.Container, pod *corev1.Pod, kubeconfig string, probe int, overrides ...string) *cluster.Process {
	t.Helper()
	env := []string{"KUBECONFIG=" + kubeconfig}
	for _, e := range ctr.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil && f.FieldRef != nil {
			switch f.FieldRef.FieldPath {
			case "metadata.namespace":
				v = pod.Namespace
			case "metadata.name":
				v = pod.Name
			case "metadata.uid":
				v = string(pod.UID)
			}
		}
		env = append(env, e.Name+"="+v)
	}
	args := append(append(append([]string(nil), ctr.Args...), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe)), overrides...)
	p, err := cluster.StartProcess(name, t.TempDir(), cluster.MustHookwrightBinary(t), args, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	err = cluster.WaitFor(ctx, 2*time.Minute, name+" ready", p.ProbeOK(probe, "/readyz"))
	if err != nil {
		t.Fatalf("%v\nargs: %s\nlog:\n%s", err, strings.Join(args, " "), p.Tail(3000))
	}
	return p
}

// route sends the API server's calls to Service ns/name to local.
func route(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, local string) {
	t.Helper()
	svc := &corev1.Service{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		t.Fatal(err)
	}
	if err := c.RouteService(svc, local); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.UnrouteService(svc) })
}

// checkUninstallKeepsCRs deletes the Subscription, then the installed CSV,
// with a SidecarInjector (failurePolicy Fail in effect) and a NodeOversell
// kept, as OLM's uninstall (`kubectl delete subscription`, then `kubectl
// delete csv`) and OperatorHub's do (OLM keeps CRDs and CRs). The
// Subscription goes first: with it left, OLM may create the CSV again and
// adopt the operator's Deployment before the garbage collector deletes
// it (seen: the Deployment stayed, owned by a CSV of the same name).
//
// kwok runs no process, so the operator and the injector run here as
// local processes standing for their pods: `hookwright manager` with the
// CSV's args and env, as the CSV's ServiceAccount (the RBAC OLM granted),
// its validating webhook and the injector reached through their Services.
// Once OLM and the garbage collector have removed the operator's
// Deployment and its pod, the test sends the manager SIGTERM as the
// kubelet would. Within 60 s every hookwright configuration must be
// Ignore or gone, and with neither operator nor injector running a pod in
// the injector's scope and a CR spec change must be admitted.
func checkUninstallKeepsCRs(ctx context.Context, t *testing.T, o *olm.OLM, in *olm.Installation, si *hookwrightv1alpha1.SidecarInjector, no *hookwrightv1alpha1.NodeOversell) {
	t.Helper()
	c := o.Client
	csv := &operatorsv1alpha1.ClusterServiceVersion{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: in.CSV()}, csv); err != nil {
		t.Fatal(err)
	}
	ds := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0]
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: ds.Name}, dep); err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(in.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		t.Fatal(err)
	}
	// A pod of the upgrade's old ReplicaSet may still be terminating.
	live := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	if len(live) == 0 {
		t.Fatalf("operator pods: none live of %d", len(pods.Items))
	}
	pod := &live[0]

	// The manager, as pod's container, with the CSV's identity.
	var mgrCtr corev1.Container
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		if len(ctr.Args) > 0 && ctr.Args[0] == "manager" {
			mgrCtr = ctr
		}
	}
	if mgrCtr.Name == "" {
		t.Fatalf("csv %s: no container runs the manager", csv.Name)
	}
	webhookPort := cluster.MustFreePort(t)
	mgr := startLocal(ctx, t, "manager", mgrCtr, pod,
		saKubeconfig(t, o.Cluster, in.Namespace, ds.Spec.Template.Spec.ServiceAccountName), cluster.MustFreePort(t),
		"--metrics-bind-address=0", fmt.Sprintf("--webhook-port=%d", webhookPort), "--ca-dir="+t.TempDir(), "--drain-period=0s")
	route(ctx, t, o.Cluster, in.Namespace, desired.DefaultWebhookService, fmt.Sprintf("127.0.0.1:%d", webhookPort))

	// The injector, as its server pod, once the operator made its objects.
	base := desired.SidecarKind.BaseName(si.Name)
	server := &appsv1.Deployment{}
	tls := &corev1.Secret{}
	injPods := &corev1.PodList{}
	err = cluster.WaitFor(ctx, 2*time.Minute, "injector Deployment, pod and serving Secret", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: base}, server); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: base + "-tls"}, tls); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if err := c.List(ctx, injPods, client.InNamespace(in.Namespace), client.MatchingLabels(server.Spec.Selector.MatchLabels)); err != nil {
			return false, err
		}
		return len(tls.Data[corev1.TLSCertKey]) > 0 && len(injPods.Items) > 0, nil
	})
	if err != nil {
		t.Fatalf("%v\nmanager log:\n%s", err, mgr.Tail(4000))
	}
	certDir := t.TempDir()
	for k, f := range map[string]string{corev1.TLSCertKey: "tls.crt", corev1.TLSPrivateKeyKey: "tls.key"} {
		if err := os.WriteFile(filepath.Join(certDir, f), tls.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	injPort := cluster.MustFreePort(t)
	inj := startLocal(ctx, t, "injector", server.Spec.Template.Spec.Containers[0], &injPods.Items[0],
		saKubeconfig(t, o.Cluster, in.Namespace, server.Spec.Template.Spec.ServiceAccountName), cluster.MustFreePort(t),
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", injPort), "--cert-dir="+certDir,
		"--metrics-bind-address=0", "--drain-period=0s")
	route(ctx, t, o.Cluster, in.Namespace, base, fmt.Sprintf("127.0.0.1:%d", injPort))

	// Fail in effect (the probe saw the injector answer), as in a cluster
	// that ran for a while; the NodeOversell's configuration is there.
	var closed []string
	err = cluster.WaitFor(ctx, 3*time.Minute, "injector Fail and NodeOversell configuration published", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: desired.OversellKind.BaseName(no.Name)}, &admissionregistrationv1.MutatingWebhookConfiguration{}); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		var err error
		if closed, err = cluster.FailClosed(ctx, c); err != nil {
			return false, err
		}
		for _, w := range closed {
			if strings.HasPrefix(w, base+"/") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v (Fail on %v)\nmanager log:\n%s", err, closed, mgr.Tail(4000))
	}
	t.Logf("before the uninstall, failurePolicy Fail on %v", closed)

	// kubectl delete subscription, then kubectl delete csv: OLM removes
	// what it installed, the garbage collector the Deployment and its
	// pods; then the kubelet's SIGTERM.
	start := time.Now()
	sub := &operatorsv1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: in.Subscription}}
	if err := c.Delete(ctx, sub); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, csv); err != nil {
		t.Fatal(err)
	}
	err = cluster.WaitFor(ctx, 2*time.Minute, "operator pod "+pod.Name+" deleted", func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{}
		err := c.Get(ctx, client.ObjectKeyFromObject(pod), p)
		return apierrors.IsNotFound(err) || err == nil && (p.DeletionTimestamp != nil || p.UID != pod.UID), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatal(err)
	}
	podGone := time.Since(start)
	// The kubelet's SIGTERM, while the configurations are watched.
	stopped := make(chan error, 1)
	var exited time.Duration
	go func() {
		err := mgr.Stop(45 * time.Second)
		exited = time.Since(start)
		stopped <- err
	}()
	var left []string
	err = cluster.WaitFor(ctx, 60*time.Second, "every hookwright webhook configuration Ignore or gone", func(ctx context.Context) (bool, error) {
		var err error
		if left, err = cluster.FailClosed(ctx, c); err != nil {
			return false, err
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("%v; still Fail: %v\nthe manager's uninstall lines:\n%s\nthe injector's fail-open lines:\n%s\nthe operator's Deployment now: %s\nthe injector's log tail:\n%s",
			err, left, grepLog(mgr.Log, `"uninstall"`), grepLog(inj.Log, "failopen"), operatorDeploymentState(ctx, c, client.ObjectKeyFromObject(dep)), inj.Tail(3000))
	}
	ignored := time.Since(start)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: subscription and csv deleted; operator pod deleting after %s, every configuration Ignore after %s, manager exited after %s",
		podGone.Round(time.Millisecond), ignored.Round(time.Millisecond), exited.Round(time.Millisecond))
	t.Logf("who switched: the manager's uninstall lines:\n%s\nthe injector's fail-open lines:\n%s\nthe operator's Deployment now: %s",
		grepLog(mgr.Log, `"uninstall"`), grepLog(inj.Log, "failurePolicy"), operatorDeploymentState(ctx, c, client.ObjectKeyFromObject(dep)))

	// Neither operator nor injector runs: a pod in the injector's scope
	// and a CR spec change are admitted.
	_ = inj.Stop(5 * time.Second)
	const appsNS = "uninstall-apps"
	if _, err := o.Cluster.CreateNamespace(ctx, appsNS, si.Spec.NamespaceSelector.MatchLabels); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: appsNS},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}}}
	if err := c.Create(ctx, p, client.DryRunAll); err != nil {
		t.Fatalf("pod in the injector's scope refused after the uninstall: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
		t.Fatal(err)
	}
	si.Spec.TimeoutSeconds = new(int32)
	*si.Spec.TimeoutSeconds = 3
	if err := c.Update(ctx, si, client.DryRunAll); err != nil {
		t.Fatalf("SidecarInjector spec change refused after the uninstall: %v", err)
	}
}

// grepLog returns the lines of the log file at path that contain sub.
// operatorDeploymentState says what the injector's fail-open check reads
// of the operator's Deployment: gone, deleting, its replicas and owners.
func operatorDeploymentState(ctx context.Context, c client.Client, key client.ObjectKey) string {
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, key, d); err != nil {
		return err.Error()
	}
	var owners []string
	for _, o := range d.OwnerReferences {
		owners = append(owners, o.Kind+"/"+o.Name+" "+string(o.UID))
	}
	var csvs operatorsv1alpha1.ClusterServiceVersionList
	if err := c.List(ctx, &csvs, client.InNamespace(key.Namespace)); err != nil {
		return err.Error()
	}
	var names []string
	for _, v := range csvs.Items {
		names = append(names, fmt.Sprintf("%s (uid %s, created %s)", v.Name, v.UID, v.CreationTimestamp.UTC().Format(time.TimeOnly)))
	}
	return fmt.Sprintf("uid %s created %s, deleting %v, replicas %v, owners %v; CSVs in %s: %v", d.UID, d.CreationTimestamp.UTC().Format(time.TimeOnly), d.DeletionTimestamp != nil, ptr.Deref(d.Spec.Replicas, 1), owners, key.Namespace, names)
}

func grepLog(path, sub string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
