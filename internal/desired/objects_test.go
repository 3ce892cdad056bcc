package desired

import (
	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
)

var testSettings = Settings{Namespace: "hookwright-system", Image: "ghcr.io/hookwright/hookwright:v1.2.3", OperatorDeployment: "hookwright-controller-manager"}

func testInjector() *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh", UID: types.UID("11111111-2222-3333-4444-555555555555"), Generation: 3},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"sidecar-injection": "enabled"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "api"},
				}},
			},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"mesh": "on"}},
		},
	}
}

func testOversell() *v1alpha1.NodeOversell {
	return &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", UID: types.UID("66666666-7777-8888-9999-000000000000"), Generation: 1},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "oversell"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2", Memory: "1.5"},
			Server: v1alpha1.ServerSpec{
				Namespace: "nodes-system", Replicas: ptr.To[int32](1), Image: "example.com/hw:custom",
				Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.2")}},
				// The golden file shows both availability overrides.
				PriorityClassName: "hookwright-servers",
				TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
					MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule,
				}},
			},
		},
	}
}

// withCA sets the caBundle of d's webhooks as internal/certificates/sources.Publish
// does, so the golden files show where it goes.
func withCA(d *Desired, ca string) *Desired {
	for i := range d.Webhook.Webhooks {
		d.Webhook.Webhooks[i].ClientConfig.CABundle = []byte(ca)
	}
	return d
}

// renderGolden renders every desired object as a YAML stream, each in its
// server-side apply form (what is sent to the API server).
func renderGolden(t *testing.T, d *Desired) []byte {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, o := range d.Objects() {
		gvk, err := apiutil.GVKForObject(o, s)
		if err != nil {
			t.Fatal(err)
		}
		u, err := apply.ToApplyObject(o, gvk)
		if err != nil {
			t.Fatal(err)
		}
		b, err := yaml.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		buf.WriteString("---\n")
		buf.Write(b)
	}
	return buf.Bytes()
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("REFRESH_GOLDEN") == "1" {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (REFRESH_GOLDEN=1 writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the builder output (REFRESH_GOLDEN=1 regenerates it); got:\n%s", path, got)
	}
}

func TestGoldenSidecarInjector(t *testing.T) {
	checkGolden(t, "sidecarinjector.golden.yaml", renderGolden(t, withCA(BuildSidecarInjector(testInjector(), testSettings), "CA-PEM")))
}

func TestGoldenNodeOversell(t *testing.T) {
	checkGolden(t, "nodeoversell.golden.yaml", renderGolden(t, withCA(BuildNodeOversell(testOversell(), testSettings), "CA-PEM")))
}

func TestBuildIsDeterministicAndPure(t *testing.T) {
	si := testInjector()
	before := si.DeepCopy()
	a := renderGolden(t, withCA(BuildSidecarInjector(si, testSettings), "x"))
	b := renderGolden(t, withCA(BuildSidecarInjector(si, testSettings), "x"))
	if !bytes.Equal(a, b) {
		t.Fatal("two builds differ")
	}
	if !equalJSON(t, si, before) {
		t.Fatal("the builder modified its input CR")
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	x, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

func TestNamespaceSelectorAlwaysExcludesSystemAndOperator(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sel      *metav1.LabelSelector
		serverNS string
		wantExpr int
		wantNS   []string
	}{
		{"no selector", nil, "", 1, []string{"kube-system", "kube-public", "kube-node-lease", "hookwright-system"}},
		{"user expressions kept", testInjector().Spec.NamespaceSelector, "", 2, []string{"kube-system", "kube-public", "kube-node-lease", "hookwright-system"}},
		{"server namespace too", nil, "mesh-system", 1, []string{"kube-system", "kube-public", "kube-node-lease", "hookwright-system", "mesh-system"}},
		{"operator namespace is a system one", nil, "kube-system", 1, []string{"kube-system", "kube-public", "kube-node-lease", "hookwright-system"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			si := testInjector()
			si.Spec.NamespaceSelector = tc.sel
			si.Spec.Server.Namespace = tc.serverNS
			wh := BuildSidecarInjector(si, testSettings).Webhook.Webhooks[0]
			exprs := wh.NamespaceSelector.MatchExpressions
			if len(exprs) != tc.wantExpr {
				t.Fatalf("%d expressions, want %d: %+v", len(exprs), tc.wantExpr, exprs)
			}
			last := exprs[len(exprs)-1]
			if last.Key != corev1.LabelMetadataName || last.Operator != metav1.LabelSelectorOpNotIn || !slices.Equal(last.Values, tc.wantNS) {
				t.Fatalf("exclusion %+v, want NotIn %v", last, tc.wantNS)
			}
			if tc.sel != nil && len(tc.sel.MatchExpressions) != 1 {
				t.Fatal("the CR's selector was modified")
			}
		})
	}
}

func TestDefaultsAndOverrides(t *testing.T) {
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}
	d := BuildSidecarInjector(si, testSettings)
	wh := d.Webhook.Webhooks[0]
	if *wh.FailurePolicy != "Fail" || *wh.TimeoutSeconds != 5 || *wh.ReinvocationPolicy != "IfNeeded" || wh.ObjectSelector == nil ||
		len(wh.ObjectSelector.MatchLabels) != 0 || len(wh.ObjectSelector.MatchExpressions) != 1 {
		t.Fatalf("injector defaults: %+v", wh)
	}
	if *d.Deployment.Spec.Replicas != 2 || d.PodDisruptionBudget == nil || d.Deployment.Spec.Template.Spec.Containers[0].Image != testSettings.Image {
		t.Fatal("default replicas 2 with a PDB and the operator's image")
	}
	if d.Deployment.Namespace != testSettings.Namespace {
		t.Fatalf("namespace %s", d.Deployment.Namespace)
	}
	if got := d.Deployment.Spec.Template.Spec.Containers[0].Args; !slices.Contains(got, "--operator-namespace=hookwright-system") {
		t.Fatalf("args %v", got)
	}

	no := testOversell()
	d = BuildNodeOversell(no, testSettings)
	wh = d.Webhook.Webhooks[0]
	if *wh.FailurePolicy != "Ignore" || *wh.TimeoutSeconds != 2 || wh.ReinvocationPolicy != nil || wh.NamespaceSelector != nil {
		t.Fatalf("oversell defaults: %+v", wh)
	}
	// Heartbeats reach only the servers of the NodeOversells selecting the
	// node, each acting for its own CR (issue 11: overlapping CRs compounded).
	if !reflect.DeepEqual(wh.ObjectSelector, withoutManaged(no.Spec.NodeSelector)) {
		t.Fatalf("oversell objectSelector %+v, want the nodeSelector %+v and no managed node", wh.ObjectSelector, no.Spec.NodeSelector)
	}
	if args := d.Deployment.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--node-oversell="+no.Name) {
		t.Fatalf("oversell server args %v lack --node-oversell=%s", args, no.Name)
	}
	no.Spec.NodeSelector = nil
	if wh := BuildNodeOversell(no, testSettings).Webhook.Webhooks[0]; !reflect.DeepEqual(wh.ObjectSelector, withoutManaged(nil)) {
		t.Fatalf("an absent nodeSelector (every node) must give every unmanaged node, got %+v", wh.ObjectSelector)
	}
	no = testOversell()
	if d.PodDisruptionBudget != nil {
		t.Fatal("replicas 1 must have no PDB (minAvailable 1 would block every drain)")
	}
	ct := d.Deployment.Spec.Template.Spec.Containers[0]
	if ct.Image != "example.com/hw:custom" || d.Deployment.Namespace != "nodes-system" || ct.Args[0] != "oversell" {
		t.Fatalf("overrides: image %s namespace %s args %v", ct.Image, d.Deployment.Namespace, ct.Args)
	}
	if ct.Resources.Requests.Cpu().String() != "200m" || ct.Resources.Limits != nil {
		t.Fatalf("resources %+v", ct.Resources)
	}
	if d.ClusterRole.Rules[0].ResourceNames != nil || d.ClusterRole.Rules[0].Resources[0] != "nodeoversells" {
		t.Fatalf("oversell role %+v", d.ClusterRole.Rules)
	}
	if s := d.ClusterRoleBinding.Subjects[0]; s.Namespace != "nodes-system" || s.Name != d.ServiceAccount.Name {
		t.Fatalf("binding subject %+v", s)
	}
	if v := d.Webhook.Webhooks[0].ClientConfig.Service; v.Namespace != "nodes-system" || v.Name != d.Service.Name {
		t.Fatalf("service ref %+v", v)
	}
}

// A NodeOversell stored with failurePolicy Fail before the CRD forbade it
// stays updatable (validation ratcheting), but its webhook is Ignore: with
// Fail a server outage would block every selected node's status writes.
func TestNodeOversellWebhookIsAlwaysIgnore(t *testing.T) {
	no := testOversell()
	no.Spec.FailurePolicy = v1alpha1.FailurePolicyFail
	wh := BuildNodeOversell(no, testSettings).Webhook.Webhooks[0]
	if *wh.FailurePolicy != "Ignore" {
		t.Fatalf("failurePolicy %s for a stored Fail, want Ignore", *wh.FailurePolicy)
	}
}

func TestLeastPrivilegeRules(t *testing.T) {
	for _, d := range []*Desired{BuildSidecarInjector(testInjector(), testSettings), BuildNodeOversell(testOversell(), testSettings)} {
		r := d.ClusterRole.Rules[0]
		if !slices.Equal(r.Verbs, []string{"get", "list", "watch"}) || !slices.Equal(r.APIGroups, []string{"admission.hookwright.io"}) || len(r.Resources) != 1 {
			t.Fatalf("rule %+v", r)
		}
		for _, r := range d.ClusterRole.Rules {
			for _, s := range append(append(slices.Clone(r.Verbs), r.Resources...), r.APIGroups...) {
				if strings.Contains(s, "*") {
					t.Fatalf("wildcard in %+v", r)
				}
			}
		}
	}
	if d := BuildNodeOversell(testOversell(), testSettings); len(d.ClusterRole.Rules) != 1 {
		t.Fatalf("oversell rules %+v", d.ClusterRole.Rules)
	}
	d := BuildSidecarInjector(testInjector(), testSettings)
	if got := d.ClusterRole.Rules[0].ResourceNames; !slices.Equal(got, []string{"mesh"}) {
		t.Fatalf("injector resourceNames %v", got)
	}
	// The fail-open rules: one named object each, no list or watch.
	want := map[string][]string{
		"deployments":                     {"get", "hookwright-controller-manager"},
		"mutatingwebhookconfigurations":   {"get", "patch", d.Webhook.Name},
		"validatingwebhookconfigurations": {"get", "patch", ValidatingConfigName},
	}
	if len(d.ClusterRole.Rules) != 1+len(want) {
		t.Fatalf("injector rules %+v", d.ClusterRole.Rules)
	}
	for _, r := range d.ClusterRole.Rules[1:] {
		if len(r.Resources) != 1 || len(r.ResourceNames) != 1 || !slices.Equal(append(slices.Clone(r.Verbs), r.ResourceNames...), want[r.Resources[0]]) {
			t.Fatalf("injector rule %+v", r)
		}
	}
	if !slices.Contains(d.Deployment.Spec.Template.Spec.Containers[0].Args, "--operator-deployment=hookwright-system/hookwright-controller-manager") {
		t.Fatalf("injector args %v", d.Deployment.Spec.Template.Spec.Containers[0].Args)
	}
	// Without an operator Deployment (tests, out of cluster): no flag, no rules.
	off := testSettings
	off.OperatorDeployment = ""
	if d := BuildSidecarInjector(testInjector(), off); len(d.ClusterRole.Rules) != 1 ||
		slices.ContainsFunc(d.Deployment.Spec.Template.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--operator-deployment") }) {
		t.Fatalf("off: rules %+v args %v", d.ClusterRole.Rules, d.Deployment.Spec.Template.Spec.Containers[0].Args)
	}
}

func TestOwnerReferencesOnEveryObject(t *testing.T) {
	si := testInjector()
	for _, o := range BuildSidecarInjector(si, testSettings).Objects() {
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].UID != si.UID || refs[0].Kind != "SidecarInjector" || !*refs[0].Controller || !*refs[0].BlockOwnerDeletion ||
			refs[0].APIVersion != "admission.hookwright.io/v1alpha1" {
			t.Fatalf("%T %s: owner references %+v", o, o.GetName(), refs)
		}
		if o.GetLabels()[LabelManagedBy] != ManagedByValue {
			t.Fatalf("%T: labels %v", o, o.GetLabels())
		}
	}
}

func TestBaseName(t *testing.T) {
	long := strings.Repeat("a", 100)
	for _, tc := range []struct{ cr, want string }{
		{"mesh", "hookwright-sidecar-mesh"},
		{"my.injector", "hookwright-sidecar-my-injector-"},
		{long, "hookwright-sidecar-aaaa"},
		{strings.Repeat("b", 44), "hookwright-sidecar-" + strings.Repeat("b", 44)},
	} {
		got := SidecarKind.BaseName(tc.cr)
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("BaseName(%q) = %q, want prefix %q", tc.cr, got, tc.want)
		}
		if errs := validation.IsDNS1035Label(got); len(errs) > 0 {
			t.Errorf("BaseName(%q) = %q is not a DNS-1035 label: %v", tc.cr, got, errs)
		}
		if SidecarKind.BaseName(tc.cr) != got {
			t.Error("not deterministic")
		}
	}
	if SidecarKind.BaseName(long) == SidecarKind.BaseName(long+"x") {
		t.Error("two long names collide")
	}
	if SidecarKind.BaseName("a.b") == SidecarKind.BaseName("a-b") {
		t.Error("a dotted name collides with its dashed form")
	}
	// Service names are DNS-1035 labels; the serving Secret adds "-tls".
	if n := ServingSecretName(SidecarCR(&v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: long}})); len(validation.IsDNS1123Subdomain(n)) > 0 {
		t.Errorf("secret name %q invalid", n)
	}
}

// Opted-out pods never reach the injector: the objectSelector excludes the
// label's false spellings (each one ParseBool reads as false) and keeps the
// user's own selector, which is not modified.
func TestInjectorObjectSelectorExcludesOptOut(t *testing.T) {
	user := &metav1.LabelSelector{MatchLabels: map[string]string{"mesh": "on"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists}}}
	for _, tc := range []struct {
		name string
		sel  *metav1.LabelSelector
	}{{"no user selector", nil}, {"user selector", user}} {
		t.Run(tc.name, func(t *testing.T) {
			si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1alpha1.SidecarInjectorSpec{ObjectSelector: tc.sel}}
			got := BuildSidecarInjector(si, testSettings).Webhook.Webhooks[0].ObjectSelector
			sel, err := metav1.LabelSelectorAsSelector(got)
			if err != nil {
				t.Fatal(err)
			}
			base := map[string]string{"mesh": "on", "tier": "web"}
			with := func(v string) labels.Set {
				l := labels.Set{v1alpha1.SidecarInjectKey: v}
				for k, x := range base {
					l[k] = x
				}
				return l
			}
			for _, v := range v1alpha1.SidecarOptOutLabelValues {
				if sel.Matches(with(v)) {
					t.Errorf("pod labelled %s=%s reaches the injector", v1alpha1.SidecarInjectKey, v)
				}
			}
			for _, v := range []string{"true", "yes", "maybe"} {
				if !sel.Matches(with(v)) {
					t.Errorf("pod labelled %s=%s does not reach the injector", v1alpha1.SidecarInjectKey, v)
				}
			}
			if !sel.Matches(labels.Set(base)) {
				t.Error("unlabelled pod does not reach the injector")
			}
			if tc.sel != nil && (sel.Matches(labels.Set{"mesh": "off", "tier": "web"}) || len(user.MatchExpressions) != 1) {
				t.Error("user selector lost or modified")
			}
		})
	}
}

// TestDriftTypedRoundTrip: a desired object and the same object as stored
// (converted the same way, with server defaults added) show no drift.
func TestDriftTypedRoundTrip(t *testing.T) {
	d := withCA(BuildSidecarInjector(testInjector(), testSettings), "CA")
	want, err := apply.ToApplyObject(d.Deployment, appsv1.SchemeGroupVersion.WithKind("Deployment"))
	if err != nil {
		t.Fatal(err)
	}
	live := d.Deployment.DeepCopy()
	live.UID, live.ResourceVersion, live.Generation = "uid", "12", 4
	live.Spec.RevisionHistoryLimit = new(int32)
	live.Spec.Template.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	live.Spec.Template.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
	live.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways
	live.Status.AvailableReplicas = 2
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		t.Fatal(err)
	}
	if got := apply.Drift(want.Object, m); got != nil {
		t.Fatalf("drift against defaulted live object: %v", got)
	}
	live.Spec.Template.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = new(bool)
	m, _ = runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if got := apply.Drift(want.Object, m); !slices.Equal(got, []string{"spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem"}) {
		t.Fatalf("drift = %v", got)
	}
}

func TestToApplyObjectPrunes(t *testing.T) {
	u, err := apply.ToApplyObject(BuildSidecarInjector(testInjector(), testSettings).ServiceAccount, corev1.SchemeGroupVersion.WithKind("ServiceAccount"))
	if err != nil {
		t.Fatal(err)
	}
	md := u.Object["metadata"].(map[string]any)
	if _, ok := md["creationTimestamp"]; ok {
		t.Fatal("creationTimestamp kept")
	}
	if _, ok := u.Object["status"]; ok {
		t.Fatal("status kept")
	}
	if u.GetAPIVersion() != "v1" || u.GetKind() != "ServiceAccount" {
		t.Fatalf("gvk %s %s", u.GetAPIVersion(), u.GetKind())
	}
}

// The self-signed Issuer's empty `selfSigned: {}` is what selects its type:
// it must survive the pruning of empty maps in the apply content.
func TestToApplyObjectKeepsSelfSigned(t *testing.T) {
	iss := certManagerIssuer(certManagerInjector(nil), testSettings)
	u, err := apply.ToApplyObject(iss, cmapi.SchemeGroupVersion.WithKind("Issuer"))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok, _ := unstructured.NestedMap(u.Object, "spec", "selfSigned"); !ok || len(v) != 0 {
		t.Fatalf("spec.selfSigned %v %v in %v", v, ok, u.Object)
	}
}

// The installation's excluded namespaces and, in mode CertManager,
// cert-manager's are kept from the injector; critical and mirror pods are
// spared by matchConditions.
func TestInjectorSparesWhatTheClusterNeeds(t *testing.T) {
	si := testInjector()
	s := testSettings
	s.ExcludedNamespaces = []string{"calico-system", "kube-system"}
	got := InjectorExcludedNamespaces(si, s)
	if !slices.Contains(got, "calico-system") || slices.Contains(got, CertManagerNamespace) {
		t.Fatalf("excluded %v: want calico-system, not cert-manager", got)
	}
	if n := len(slices.DeleteFunc(slices.Clone(got), func(ns string) bool { return ns != "kube-system" })); n != 1 {
		t.Fatalf("kube-system %d times in %v", n, got)
	}
	si.Spec.Certificate.Mode = v1alpha1.CertificateCertManager
	if got := InjectorExcludedNamespaces(si, s); !slices.Contains(got, CertManagerNamespace) {
		t.Fatalf("mode CertManager excluded %v: want cert-manager", got)
	}
	if got := InjectorSparedNamespaces(si, s); !slices.Equal(got, []string{"calico-system", "kube-system", CertManagerNamespace}) {
		t.Fatalf("mode CertManager spared %v", got)
	}
	wh := BuildSidecarInjector(si, s).Webhook.Webhooks[0]
	if !slices.Contains(wh.NamespaceSelector.MatchExpressions[len(wh.NamespaceSelector.MatchExpressions)-1].Values, CertManagerNamespace) {
		t.Fatalf("namespaceSelector %+v lacks cert-manager", wh.NamespaceSelector)
	}
	var names []string
	for _, m := range wh.MatchConditions {
		names = append(names, m.Name)
	}
	if !slices.Equal(names, []string{MatchNotCritical, MatchNotMirror}) {
		t.Fatalf("matchConditions %v", names)
	}
	for _, w := range BuildNodeOversell(testOversell(), s).Webhook.Webhooks {
		if len(w.MatchConditions) != 0 {
			t.Fatalf("oversell webhook %s has pod matchConditions", w.Name)
		}
	}
}

// withoutManaged is a NodeOversell's selector webhook's objectSelector:
// the nodeSelector, and no node a NodeOversell manages.
func withoutManaged(sel *metav1.LabelSelector) *metav1.LabelSelector {
	out := sel.DeepCopy()
	if out == nil {
		out = &metav1.LabelSelector{}
	}
	out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{Key: v1alpha1.OversellNodeLabel, Operator: metav1.LabelSelectorOpDoesNotExist})
	return out
}

// A managed node's heartbeat reaches exactly one hookwright webhook, even
// where two NodeOversells select it, so it waits at most one timeout (at
// most 5 s of the kubelet's 10 s); an unmanaged node reaches the selector
// webhooks of the NodeOversells selecting it.
func TestManagedNodeReachesOneWebhook(t *testing.T) {
	a, b := testOversell(), testOversell()
	a.Name, b.Name = "a", "b"
	var hooks []admissionregistrationv1.MutatingWebhook
	for _, no := range []*v1alpha1.NodeOversell{a, b} {
		hooks = append(hooks, BuildNodeOversell(no, testSettings).Webhook.Webhooks...)
	}
	sel := a.Spec.NodeSelector.MatchLabels
	for _, c := range []struct {
		name    string
		labels  map[string]string
		want    int
		timeout int32
	}{
		{"selected, managed by a", merge(sel, map[string]string{v1alpha1.OversellNodeLabel: "a"}), 1, 5},
		{"left the selector, held by b", map[string]string{v1alpha1.OversellNodeLabel: "b"}, 1, 5},
		{"selected, not managed yet", sel, 2, 10},
		{"not selected", map[string]string{"other": "x"}, 0, 0},
	} {
		n, sum := 0, int32(0)
		for _, w := range hooks {
			s, err := metav1.LabelSelectorAsSelector(w.ObjectSelector)
			if err != nil {
				t.Fatal(err)
			}
			if s.Matches(labels.Set(c.labels)) {
				n++
				sum += 5 // the CRD's maximum timeoutSeconds
			}
		}
		if n != c.want || sum != c.timeout {
			t.Errorf("%s: %d webhooks, %d s at most; want %d, %d s", c.name, n, sum, c.want, c.timeout)
		}
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// The server pods' priority class and topology spread: absent, no class
// and the two ScheduleAnyway spreads (hostname, zone) over the
// Deployment's own pods; set, the class as written and the user's
// constraints replacing the defaults, the Deployment's selector filled in
// where a constraint has none and a constraint's own selector kept.
func TestServerPriorityAndSpread(t *testing.T) {
	own := func(d *Desired) *metav1.LabelSelector { return d.Deployment.Spec.Selector }
	defaults := func(d *Desired) []corev1.TopologySpreadConstraint {
		return []corev1.TopologySpreadConstraint{
			{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: own(d)},
			{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: own(d)},
		}
	}
	team := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "mesh"}}
	cases := []struct {
		name     string
		server   v1alpha1.ServerSpec
		priority string
		spread   func(d *Desired) []corev1.TopologySpreadConstraint
	}{
		{name: "defaults", spread: defaults},
		{name: "empty list is the defaults", server: v1alpha1.ServerSpec{TopologySpreadConstraints: []corev1.TopologySpreadConstraint{}}, spread: defaults},
		{name: "critical class", server: v1alpha1.ServerSpec{PriorityClassName: v1alpha1.PriorityClusterCritical},
			priority: v1alpha1.PriorityClusterCritical, spread: defaults},
		{name: "user class and hard zone spread",
			server: v1alpha1.ServerSpec{PriorityClassName: "hookwright-servers", TopologySpreadConstraints: []corev1.TopologySpreadConstraint{
				{MaxSkew: 2, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule, MinDomains: ptr.To[int32](3)},
				{MaxSkew: 1, TopologyKey: "rack", WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: team},
			}},
			priority: "hookwright-servers",
			spread: func(d *Desired) []corev1.TopologySpreadConstraint {
				return []corev1.TopologySpreadConstraint{
					{MaxSkew: 2, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule, MinDomains: ptr.To[int32](3), LabelSelector: own(d)},
					{MaxSkew: 1, TopologyKey: "rack", WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: team},
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			si := testInjector()
			si.Spec.Server = tc.server
			before := si.DeepCopy()
			no := testOversell()
			no.Spec.Server = tc.server
			for _, d := range []*Desired{BuildSidecarInjector(si, testSettings), BuildNodeOversell(no, testSettings)} {
				ps := d.Deployment.Spec.Template.Spec
				if ps.PriorityClassName != tc.priority {
					t.Errorf("%s: priorityClassName %q, want %q", d.Deployment.Name, ps.PriorityClassName, tc.priority)
				}
				if want := tc.spread(d); !reflect.DeepEqual(ps.TopologySpreadConstraints, want) {
					t.Errorf("%s: topologySpreadConstraints\n%+v\nwant\n%+v", d.Deployment.Name, ps.TopologySpreadConstraints, want)
				}
			}
			if !reflect.DeepEqual(si, before) {
				t.Error("the build changed the CR")
			}
		})
	}
}
