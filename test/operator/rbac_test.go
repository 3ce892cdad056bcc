package operator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// applyConfigRBAC creates config/rbac's ServiceAccount, Roles and bindings
// (and config/server-namespace's ClusterRole) as config/default would, but with prefix instead of "hookwright-" and
// namespace ns instead of "system", and removes them when the test ends.
// It returns the ServiceAccount's user name.
func applyConfigRBAC(t *testing.T, ctx context.Context, prefix, ns string) string {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"rbac/service_account.yaml", "rbac/role.yaml", "rbac/role_binding.yaml", "rbac/leader_election_role.yaml",
		"rbac/leader_election_role_binding.yaml", "server-namespace/role.yaml", "rbac/probe_policy.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, "config", f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, "probe_policy.yaml") {
			// The policy names the ServiceAccount and itself as config/default
			// does ("hookwright-" prefix).
			b = []byte(strings.ReplaceAll(string(b), "hookwright-", prefix))
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("config/%s: %v", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			u.SetName(prefix + u.GetName())
			if u.GetNamespace() != "" {
				u.SetNamespace(ns)
			}
			if ref, ok, _ := unstructured.NestedString(u.Object, "roleRef", "name"); ok {
				_ = unstructured.SetNestedField(u.Object, prefix+ref, "roleRef", "name")
			}
			if subs, ok, _ := unstructured.NestedSlice(u.Object, "subjects"); ok {
				for _, s := range subs {
					m := s.(map[string]any)
					m["name"] = prefix + m["name"].(string)
					m["namespace"] = ns
				}
				_ = unstructured.SetNestedSlice(u.Object, subs, "subjects")
			}
			if err := env.Client.Create(ctx, u); err != nil {
				t.Fatalf("config/%s %s: %v", f, u.GetName(), err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), u) })
		}
	}
	return "system:serviceaccount:" + ns + ":" + prefix + "controller-manager"
}

// The operator's shipped RBAC (config/rbac), asked of the real API server
// with SubjectAccessReviews as its ServiceAccount: it cannot read Secrets
// outside its namespaces, create Deployments in default, or delete any
// webhook configuration, ClusterRole or ClusterRoleBinding (nothing it
// owns needs deleting by it: the garbage collector does, through
// ownerReferences), nor patch a ValidatingWebhookConfiguration other than
// its own. It can do what it needs in its namespace, and in a further
// server namespace exactly once that namespace binds
// server-namespace-role.
func TestOperatorRBACLeastPrivilege(t *testing.T) {
	ctx := cluster.TestContext(t, 2*time.Minute)
	const prefix, opNS, extraNS = "rbactest-", "rbactest-op", "rbactest-servers"
	for _, ns := range []string{opNS, extraNS} {
		if _, err := env.CreateNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	user := applyConfigRBAC(t, ctx, prefix, opNS)
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + opNS, "system:authenticated"}
	type q struct{ verb, group, resource, ns, name string }
	can := func(x q) bool {
		t.Helper()
		res, sub, _ := strings.Cut(x.resource, "/")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: x.verb, Group: x.group, Resource: res, Subresource: sub, Namespace: x.ns, Name: x.name},
		}}
		r, err := env.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Allowed
	}
	// The RBAC authorizer reads bindings from an informer, so a binding
	// takes effect a moment after its create returns: what must be allowed
	// is polled for, up to 30s.
	canEventually := func(x q) bool {
		t.Helper()
		_, err := cluster.Poll(ctx, 50*time.Millisecond, 30*time.Second, "allowed", func(context.Context) (bool, error) {
			return can(x), nil
		})
		return err == nil
	}
	str := func(x q) string {
		return fmt.Sprintf("%s %s (group %q) ns=%q name=%q", x.verb, x.resource, x.group, x.ns, x.name)
	}
	// Denials mean something only once the bindings are in effect.
	if bound := (q{"get", "", "secrets", opNS, desired.CASecretName}); !canEventually(bound) {
		t.Fatalf("config/rbac's bindings never took effect: %s still denied after 30s", str(bound))
	}
	for _, x := range []q{
		{"get", "", "secrets", "kube-system", "bootstrap-token-abcdef"},
		{"list", "", "secrets", "kube-system", ""},
		{"list", "", "secrets", "", ""},
		{"create", "apps", "deployments", "default", ""},
		{"create", "apps", "deployments", extraNS, ""},
		{"delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "someone-elses"},
		{"delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", desired.SidecarKind.BaseName("mesh")},
		{"delete", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "someone-elses"},
		{"delete", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", desired.ValidatingConfigName},
		{"patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "someone-elses"},
		{"delete", "rbac.authorization.k8s.io", "clusterroles", "", "cluster-admin"},
		{"delete", "rbac.authorization.k8s.io", "clusterrolebindings", "", "cluster-admin"},
		{"create", "rbac.authorization.k8s.io", "rolebindings", opNS, ""},
		{"patch", "", "nodes", "", "kwok-node-0"},
		{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", "someone-elses.example.com"},
		{"list", "apiextensions.k8s.io", "customresourcedefinitions", "", ""},
		{"update", "apiextensions.k8s.io", "customresourcedefinitions", "", sources.InstallationCRDs[0]},
		{"delete", "apiextensions.k8s.io", "customresourcedefinitions", "", sources.InstallationCRDs[1]},
		{"sign", "certificates.k8s.io", "signers", "", "kubernetes.io/kube-apiserver-client"},
		{"approve", "certificates.k8s.io", "signers", "", "kubernetes.io/kube-apiserver-client"},
		{"attest", "certificates.k8s.io", "signers", "", "example.com/other"},
		{"get", "apps", "deployments", "kube-system", "coredns"},
		{"list", "apps", "deployments", "", ""},
	} {
		if can(x) {
			t.Errorf("the operator's ServiceAccount may %s", str(x))
		}
	}
	// What it needs (so the denials above are not those of a broken binding).
	for _, x := range []q{
		{"create", "apps", "deployments", opNS, ""},
		{"get", "", "secrets", opNS, desired.CASecretName},
		{"watch", "", "secrets", opNS, ""},
		{"create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", ""},
		{"patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", desired.ValidatingConfigName},
		{"patch", "", "nodes/status", "", "kwok-node-0"},
		{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", sources.InstallationCRDs[0]},
		{"get", "apiextensions.k8s.io", "customresourcedefinitions", "", sources.InstallationCRDs[1]},
		{"sign", "certificates.k8s.io", "signers", "", "hookwright.io/webhook-serving"},
		{"attest", "certificates.k8s.io", "signers", "", "hookwright.io/webhook-serving"},
		{"update", "certificates.k8s.io", "certificatesigningrequests/status", "", ""},
		// The injector servers' fail-open rules, held cluster-wide.
		{"get", "apps", "deployments", "", "hookwright-controller-manager"},
	} {
		if !canEventually(x) {
			t.Errorf("the operator's ServiceAccount may not %s, which it needs", str(x))
		}
	}

	// A further allowed server namespace, bound as docs/security.md says.
	rb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
		"metadata": map[string]any{"name": prefix + "servers", "namespace": extraNS},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": prefix + "server-namespace-role"},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": prefix + "controller-manager", "namespace": opNS}},
	}}
	create(t, ctx, rb)
	for _, x := range []q{
		{"create", "apps", "deployments", extraNS, ""},
		{"list", "", "secrets", extraNS, ""},
		{"create", "policy", "poddisruptionbudgets", extraNS, ""},
		{"create", "cert-manager.io", "certificates", extraNS, ""},
	} {
		if !canEventually(x) {
			t.Errorf("with server-namespace-role bound, the operator may not %s", str(x))
		}
	}
	if can(q{"get", "", "secrets", "kube-system", ""}) || can(q{"create", "apps", "deployments", "default", ""}) {
		t.Error("binding server-namespace-role in one namespace granted more than that namespace")
	}

	// The webhook probes' pods create, which RBAC grants everywhere, is
	// confined to dry runs by config/rbac/probe_policy.yaml, and namespace
	// writes to the probe namespaces: asked of the API server as the
	// ServiceAccount.
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	as, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	pod := func() *corev1.Pod {
		return &corev1.Pod{
			// A generated name: a pod a first real create made may still be
			// terminating when the dry run below is sent.
			ObjectMeta: metav1.ObjectMeta{GenerateName: "rbac-probe-", Namespace: opNS},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}
	}
	err = cluster.WaitFor(ctx, 30*time.Second, "the probe policy refusing a real pod create", func(ctx context.Context) (bool, error) {
		p := pod()
		err := as.Create(ctx, p)
		if err == nil {
			_ = env.Client.Delete(ctx, p, client.GracePeriodSeconds(0))
			return false, nil
		}
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only as server-side dry runs"), nil
	})
	if err != nil {
		t.Errorf("a real pod create by the operator's ServiceAccount is not refused by the probe policy: %v", err)
	}
	if err := as.Create(ctx, pod(), client.DryRunAll); err != nil {
		t.Errorf("a dry-run pod create by the operator's ServiceAccount: %v", err)
	}
	// RBAC's escalation check lets it write an injector server's
	// ClusterRole with the fail-open rules (desired.failOpenRules).
	si := cluster.SampleInjector(t, "rbac-escalation")
	role := desired.BuildSidecarInjector(si, desired.Settings{Namespace: opNS, Image: serverImage, OperatorDeployment: "hookwright-controller-manager"}).ClusterRole
	role.Name, role.OwnerReferences = prefix+"server-role", nil
	if len(role.Rules) < 4 {
		t.Fatalf("server rules %+v lack the fail-open ones", role.Rules)
	}
	if err := as.Create(ctx, role, client.DryRunAll); err != nil {
		t.Errorf("the operator's ServiceAccount may not create an injector server's ClusterRole: %v", err)
	}
	// The check is live for dry runs: one Deployment more is refused.
	role.Rules[1].ResourceNames = append(role.Rules[1].ResourceNames, "coredns")
	if err := as.Create(ctx, role, client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Errorf("an injector server's ClusterRole reading another Deployment: %v, want Forbidden (escalation)", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rbactest-not-a-probe"}}
	if err := as.Create(ctx, ns, client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Errorf("the operator's ServiceAccount may create namespace %s: %v", ns.Name, err)
	}
	ns = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: prefix + "probe-x"}}
	if err := as.Create(ctx, ns, client.DryRunAll); err != nil {
		t.Errorf("the operator's ServiceAccount may not create its probe namespace %s: %v", ns.Name, err)
	}
}
