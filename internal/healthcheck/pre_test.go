package healthcheck

import (
	"errors"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestMatches(t *testing.T) {
	rule := func(ops []admissionregistrationv1.OperationType, groups []string, res ...string) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: groups, APIVersions: []string{"*"}, Resources: res}}}
	}
	create := []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
	all := []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll}
	core := []string{""}
	for _, tc := range []struct {
		name        string
		rules       []admissionregistrationv1.RuleWithOperations
		pods, nodes bool
	}{
		{"pods create", rule(create, core, "pods"), true, false},
		{"pods/* is subresources only", rule(all, core, "pods/*"), false, false},
		{"* is no subresource", rule(all, core, "*"), true, false},
		{"*/* is everything", rule(all, []string{"*"}, "*/*"), true, true},
		{"*/status", rule(all, core, "*/status"), false, true},
		{"nodes/status create only", rule(create, core, "nodes/status"), false, false},
		{"nodes/* update", rule([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}, core, "nodes/*"), false, true},
		{"apps group", rule(all, []string{"apps"}, "*/*"), false, false},
	} {
		if got := Matches(tc.rules, PodCreate); got != tc.pods {
			t.Errorf("%s: pod create %v, want %v", tc.name, got, tc.pods)
		}
		if got := Matches(tc.rules, NodeStatusUpdate); got != tc.nodes {
			t.Errorf("%s: node status %v, want %v", tc.name, got, tc.nodes)
		}
	}
}

// preFacts is a cluster ready for an install.
func preFacts(t *testing.T) Facts {
	f := healthy(t)
	f.Pre = PreFacts{Resources: Got[map[string][]string]{Value: map[string][]string{
		"v1": {"pods", "pods/resize", "nodes"}, "certificates.k8s.io/v1beta1": {"clustertrustbundles"}}}}
	for _, a := range InstallerAccess {
		a.Allowed = true
		f.Pre.Access = append(f.Pre.Access, a)
	}
	return f
}

// preCase is one cluster for Pre: preFacts changed by edit.
type preCase struct {
	name string
	edit func(f *Facts)
	want []string
}

func preCases() []preCase {
	return []preCase{
		{"ready to install", func(*Facts) {}, nil},
		{"unreachable", func(f *Facts) { f.ServerVersion = Got[string]{Err: errors.New("connection refused")} },
			[]string{"fail api-reachable [kubernetes-api]: cannot get /version: connection refused"}},
		{"v1.27", func(f *Facts) {
			f.ServerVersion.Value = "v1.27.3"
			f.Pre.Resources.Value = map[string][]string{"v1": {"pods"}}
		}, []string{"fail kube-version [kubernetes-api]: v1.27.3",
			"fail match-conditions [kubernetes-features]: needs v1.28.0, the server is v1.27.3",
			"warn native-sidecars [kubernetes-features]: needs v1.29.0",
			"warn in-place-resize [kubernetes-features]: pods/resize not served (on by default since v1.33, GA in v1.35)",
			"warn cluster-trust-bundle [kubernetes-features]: clustertrustbundles not served",
			"warn watch-list [kubernetes-features]: needs v1.34.0"}},
		{"v1.33 from a distribution", func(f *Facts) { f.ServerVersion.Value = "v1.33.5-eks-1234" },
			[]string{"warn watch-list [kubernetes-features]: needs v1.34.0, the server is v1.33.5-eks-1234"}},
		{"installer lacks rights", func(f *Facts) {
			f.Pre.Access[0].Allowed = false
			f.Pre.Access[0].Reason = "no RBAC policy matched"
			f.Pre.Access[6].Namespace = "hookwright-system"
			f.Pre.Access[6].Allowed = false
		}, []string{"fail installer-rbac [installer-rbac]: denied: no RBAC policy matched", "fail installer-rbac [installer-rbac]: denied"}},
		{"other injectors", func(f *Facts) {
			w := *f.MutatingWebhooks.Value[0].DeepCopy()
			w.Name, w.Labels = "istio-sidecar-injector", nil
			w.Webhooks[0].Name = "namespace.sidecar-injector.istio.io"
			w.Webhooks[0].ReinvocationPolicy = ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy)
			n := *f.MutatingWebhooks.Value[1].DeepCopy()
			n.Name, n.Labels = "node-labeller", nil
			n.Webhooks[0].NamespaceSelector = &metav1.LabelSelector{}
			f.MutatingWebhooks.Value = append(f.MutatingWebhooks.Value, w, n)
		}, []string{"warn webhook-overlap [existing-webhooks]: pod CREATE: istio-sidecar-injector/namespace.sidecar-injector.istio.io (reinvoked); nodes/status UPDATE: node-labeller/hookwright-oversell-no.hookwright.io"}},
		{"webhooks forbidden", func(f *Facts) {
			f.MutatingWebhooks.Err = forbidden
			f.Pre.Resources.Err = forbidden
		}, []string{"warn in-place-resize", "warn cluster-trust-bundle", "fail webhook-overlap [existing-webhooks]: forbidden"}},
	}
}

func TestPre(t *testing.T) {
	for _, tc := range preCases() {
		t.Run(tc.name, func(t *testing.T) {
			f := preFacts(t)
			tc.edit(&f)
			rs := Pre(f)
			got := lines(rs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d non-OK lines, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("line %d:\n got %s\nwant %s", i, got[i], tc.want[i])
				}
			}
			for _, r := range rs {
				if (r.Status == Warn || r.Status == Fail) && r.Hint == "" {
					t.Errorf("%s %s has no hint", r.Status, r.ID)
				}
			}
		})
	}
}
