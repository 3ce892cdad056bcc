package controllers

import (
	"os"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// readRBAC decodes the documents of a file under config/.
func readRBAC(t *testing.T, file string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile("../config/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, doc := range strings.Split(string(b), "\n---") {
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(m) > 0 {
			out = append(out, m)
		}
	}
	return out
}

func rulesOf(t *testing.T, doc map[string]any) []rbacv1.PolicyRule {
	t.Helper()
	b, err := yaml.Marshal(doc["rules"])
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	return rules
}

// The ClusterRole bound in further server namespaces grants exactly the
// generated Role of the operator's namespace (make manifests regenerates
// config/rbac/role.yaml from the markers; config/server-namespace/role.yaml
// is kept by hand).
func TestServerNamespaceRoleMatches(t *testing.T) {
	var role []rbacv1.PolicyRule
	for _, d := range readRBAC(t, "rbac/role.yaml") {
		if d["kind"] == "Role" {
			role = rulesOf(t, d)
		}
	}
	if len(role) == 0 {
		t.Fatal("config/rbac/role.yaml has no namespaced Role (markers with namespace=system)")
	}
	docs := readRBAC(t, "server-namespace/role.yaml")
	if len(docs) != 1 || docs[0]["kind"] != "ClusterRole" {
		t.Fatalf("config/server-namespace/role.yaml: want one ClusterRole, got %v", docs)
	}
	if got := rulesOf(t, docs[0]); !equality.Semantic.DeepEqual(got, role) {
		t.Fatalf("config/server-namespace/role.yaml rules differ from config/rbac/role.yaml's Role: copy the Role's rules\n got %+v\nwant %+v", got, role)
	}
}

// No namespaced object is granted cluster-wide, and nothing deletes a
// cluster-scoped object: the generated ClusterRole's rules.
func TestClusterRoleHasNoNamespacedWritesOrDeletes(t *testing.T) {
	for _, d := range readRBAC(t, "rbac/role.yaml") {
		if d["kind"] != "ClusterRole" {
			continue
		}
		for _, r := range rulesOf(t, d) {
			for _, res := range r.Resources {
				switch res {
				case "secrets", "deployments", "services", "serviceaccounts", "poddisruptionbudgets", "certificates", "issuers":
					// The one exception: get on the operator's own Deployment
					// by name, which the injector servers' fail-open rule
					// needs the operator to hold (RBAC's escalation check).
					if res == "deployments" && slices.Equal(r.Verbs, []string{"get"}) && slices.Equal(r.ResourceNames, []string{"hookwright-controller-manager"}) {
						continue
					}
					t.Errorf("ClusterRole grants %v on %s cluster-wide", r.Verbs, res)
				}
			}
			for _, v := range r.Verbs {
				// Mode CSR deletes the CertificateSigningRequests it replaced
				// (generated names: no resourceNames can narrow it).
				if v == "delete" && slices.Equal(r.Resources, []string{"certificatesigningrequests"}) {
					continue
				}
				if v == "delete" || v == "*" || v == "escalate" || v == "bind" || v == "impersonate" {
					t.Errorf("ClusterRole grants %s on %v", v, r.Resources)
				}
			}
		}
	}
}
