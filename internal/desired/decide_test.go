package desired

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// The operator judges existing pods with the injector's own decision
// (sidecar.Decide, with InjectorExcludedNamespaces): for every namespace,
// it says inject exactly when the webhook configuration built here lets
// the pod through to the injector and the injector injects it. Only the
// test imports the engine; the package itself must not (internal/importrules).
func TestDecideAgreesWithTheWebhookConfiguration(t *testing.T) {
	s := testSettings
	s.AllowedNamespaces = []string{"hookwright-system", "mesh-servers", "edge-servers"}
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}, Spec: v1alpha1.SidecarInjectorSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"sidecar-injection": "enabled"}},
		Server:            v1alpha1.ServerSpec{Namespace: "mesh-servers"},
		DefaultTemplates:  []string{"proxy"},
		Templates: []v1alpha1.NamedTemplate{{Name: "proxy",
			Template: "spec:\n  containers:\n  - name: proxy\n    image: proxy:1\n"}},
	}}
	cfg, err := sidecar.Compile(si)
	if err != nil {
		t.Fatal(err)
	}
	wh := BuildSidecarInjector(si, s).Webhook.Webhooks[0]
	nsSel, err := metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	objSel, err := metav1.LabelSelectorAsSelector(wh.ObjectSelector)
	if err != nil {
		t.Fatal(err)
	}
	p := sidecar.Params{OperatorNamespace: s.Namespace, ExcludedNamespaces: InjectorExcludedNamespaces(si, s)}
	pods := map[string]*corev1.Pod{
		"plain":     {ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"app": "a"}}},
		"opted-out": {ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{v1alpha1.SidecarInjectKey: "false"}}},
	}
	for _, ns := range []string{"lab", "kube-system", "kube-public", "kube-node-lease", "hookwright-system", "mesh-servers", "edge-servers"} {
		for _, enabled := range []bool{true, false} {
			nsLabels := map[string]string{corev1.LabelMetadataName: ns}
			if enabled {
				nsLabels["sidecar-injection"] = "enabled"
			}
			for name, pod := range pods {
				reaches := nsSel.Matches(labels.Set(nsLabels)) && objSel.Matches(labels.Set(pod.Labels))
				webhook := reaches && sidecar.Decide(cfg, sidecar.Params{OperatorNamespace: s.Namespace}, sidecar.DecideInput{Pod: pod, Namespace: ns}).Inject
				d := sidecar.Decide(cfg, p, sidecar.DecideInput{Pod: pod, Namespace: ns, NamespaceLabels: nsLabels})
				if d.Inject != webhook {
					t.Errorf("namespace %s (selected %t), pod %s: Decide says %t (%s: %s), the webhook path %t",
						ns, enabled, name, d.Inject, d.Code, d.Reason, webhook)
				}
			}
		}
	}
}
