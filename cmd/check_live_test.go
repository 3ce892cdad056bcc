package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/cmd/app"
	"github.com/hookwright/hookwright/internal/healthcheck"
	"github.com/hookwright/hookwright/test/cluster"
)

// checkAgainstAPIServer runs `hookwright check` as a user runs the binary
// (a child process: its exit code and stderr) against env's real API
// server: with the CRDs and a stand-in operator Deployment and Lease; as a
// user without RBAC (--as); --pre; against an unreachable server; and,
// last, with the CRDs deleted. Every failure is a line and exit code 1,
// never a stack trace. It deletes the CRDs, so it runs last on env.
func checkAgainstAPIServer(t *testing.T, env *cluster.Cluster) {
	ctx := t.Context()
	c := env.Client
	kc := []string{"--kubeconfig", env.Kubeconfig}
	check := func(args ...string) (string, string, int) {
		t.Helper()
		stdout, stderr, code := runMain(t, append(append([]string{"check"}, kc...), args...)...)
		for _, bad := range []string{"panic", "goroutine "} {
			if strings.Contains(stderr, bad) || strings.Contains(stdout, bad) {
				t.Errorf("check %v printed %q:\n%s\n%s", args, bad, stdout, stderr)
			}
		}
		return stdout, stderr, code
	}
	want := func(what, out string, lines ...string) {
		t.Helper()
		for _, l := range lines {
			if !strings.Contains(out, l) {
				t.Errorf("%s: output lacks %q:\n%s", what, l, out)
			}
		}
	}

	// A stand-in operator: its Deployment as config/manager labels it (no
	// controller runs it, so none is available) and a fresh leader Lease.
	ns := "hw-check-op"
	if _, err := env.CreateNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app.kubernetes.io/name": "hookwright", "app.kubernetes.io/component": "manager"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hookwright-controller-manager", Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "ghcr.io/hookwright/hookwright:v0.1.0"}}}}}}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: app.LeaderElectionID},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("manager-0"), LeaseDurationSeconds: ptr.To[int32](3600),
			RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	for _, o := range []client.Object{dep, lease} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// Installed CRDs, the test's SidecarInjector (no operator reconciles
	// it), the stand-in operator.
	out, stderr, code := check("-n", ns)
	if code != 1 || stderr != "error: checks failed\n" {
		t.Errorf("with CRDs: exit %d, stderr %q; want 1 and one error line", code, stderr)
	}
	want("with CRDs", out,
		"√ can reach the API server: v1.37",
		"√ CRD sidecarinjectors.admission.hookwright.io is installed",
		"√ CRD nodeoversells.admission.hookwright.io serves and stores v1alpha1",
		"× the operator's Deployment has its replicas available: hw-check-op/hookwright-controller-manager: 0 of 2 available",
		"√ the operator has a current leader: manager-0",
		"SidecarInjector sidecar-injector\n",
		"‼ Ready is True: not reported yet",
		"× its MutatingWebhookConfiguration exists: hookwright-sidecar-sidecar-injector not found",
		"√ node heartbeats cannot time out on our webhooks: our webhooks on nodes/status: 0s of the kubelet's 10s",
		"Status check results are ×")

	// -o json: a List of CheckResult; -o jsonpath picks fields.
	out, _, code = check("-n", ns, "-o", "json")
	var list struct {
		Kind  string
		Items []struct {
			Kind     string
			Metadata struct{ Name string }
			healthcheck.Result
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 1 || list.Kind != "List" || len(list.Items) == 0 {
		t.Errorf("-o json: exit %d, %v:\n%s", code, err, out)
	} else if it := list.Items[0]; it.Kind != "CheckResult" || it.Metadata.Name != "api-reachable" || it.Status != healthcheck.OK {
		t.Errorf("-o json: first item %+v", it)
	}
	out, _, _ = check("-n", ns, "-o", `jsonpath={range .items[?(@.status=="fail")]}{.metadata.name}{"\n"}{end}`)
	want("-o jsonpath", out, "operator-replicas\n", "webhook-config.sidecarinjector.sidecar-injector\n")
	out, _, _ = check("-n", ns, "-o", "name")
	want("-o name", out, "checkresult.cli.hookwright.io/crd-present\n")
	if _, stderr, code := check("-o", "table"); code != 1 || !strings.Contains(stderr, `unable to match a printer suitable for the output format "table"`) {
		t.Errorf("-o table: exit %d, %q", code, stderr)
	}

	// A user with no rights at all, impersonated as kubectl does.
	out, stderr, code = check("-n", ns, "--as", "nobody")
	if code != 1 || stderr != "error: checks failed\n" {
		t.Errorf("--as nobody: exit %d, stderr %q", code, stderr)
	}
	want("--as nobody", out,
		"× CRD sidecarinjectors.admission.hookwright.io is installed: forbidden: cannot get customresourcedefinitions.apiextensions.k8s.io\n",
		"× the SidecarInjectors and NodeOversells can be read: forbidden: cannot list sidecarinjectors.admission.hookwright.io\n",
		"× the operator has a current leader: forbidden: cannot get leases.coordination.k8s.io in namespace hw-check-op\n"+
			"    hint: run as a user allowed to get leases.coordination.k8s.io in namespace hw-check-op (kubectl auth can-i get leases.coordination.k8s.io -n hw-check-op), e.g. with --as",
		"× no webhook of ours fails closed on every namespace: forbidden: cannot list mutatingwebhookconfigurations.admissionregistration.k8s.io\n")

	// --pre: as the admin every right is there; as nobody none is.
	out, stderr, code = check("--pre", "-n", ns)
	if code != 0 || stderr != "" {
		t.Errorf("--pre: exit %d, stderr %q:\n%s", code, stderr, out)
	}
	want("--pre", out, "√ the API server is at least v1.29.0", "√ in-place pod resize (pods/resize) is available: served by v1",
		"√ can create customresourcedefinitions.apiextensions.k8s.io", "√ can create deployments.apps in namespace hw-check-op")
	out, _, code = check("--pre", "--as", "nobody")
	if code != 1 {
		t.Errorf("--pre --as nobody: exit %d", code)
	}
	want("--pre --as nobody", out, "× can create customresourcedefinitions.apiextensions.k8s.io: denied",
		"× no other mutating webhook sees the requests ours do: forbidden")

	// An API server nobody listens on.
	dead := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(dead, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: dead, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: dead, context: {cluster: dead, user: u}}]
current-context: dead
`, "https://127.0.0.1:1")), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runMain(t, "check", "--kubeconfig", dead)
	if code != 1 || stderr != "error: checks failed\n" || !strings.Contains(stdout, "× can reach the API server: cannot get /version: ") ||
		!strings.Contains(stdout, "connection refused") || strings.Count(stdout, "×") != 2 {
		t.Errorf("unreachable: exit %d, stderr %q:\n%s", code, stderr, stdout)
	}

	// Without the CRDs (deleted: the test's SidecarInjector goes with them).
	c, err := clientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range healthcheck.CRDNames {
		crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := c.Delete(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}
	err = cluster.WaitFor(ctx, 2*time.Minute, "CRDs gone", func(ctx context.Context) (bool, error) {
		for _, name := range healthcheck.CRDNames {
			err := c.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{})
			if !apierrors.IsNotFound(err) {
				return false, client.IgnoreNotFound(err)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, code = check("-n", ns)
	if code != 1 || stderr != "error: checks failed\n" {
		t.Errorf("without CRDs: exit %d, stderr %q", code, stderr)
	}
	want("without CRDs", out,
		"× CRD sidecarinjectors.admission.hookwright.io is installed: not found\n    hint: install the CRDs",
		"× CRD nodeoversells.admission.hookwright.io is installed: not found",
		"- the SidecarInjectors and NodeOversells can be read: the CRDs are missing or not served")
}
