package healthcheck

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

var now = time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)

type keyCert struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// issue makes a certificate valid from now-1h for life, signed by parent
// (self-signed when nil).
func issue(t *testing.T, cn string, isCA bool, life time.Duration, parent *keyCert) *keyCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(life),
		IsCA: isCA, BasicConstraintsValid: true, DNSNames: []string{cn},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	signerCert, signerKey := tmpl, key
	if parent != nil {
		signerCert, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signerCert, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &keyCert{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

var (
	gr        = schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"}
	forbidden = apierrors.NewForbidden(gr, "", errors.New(`User "nobody" cannot list resource`))
)

func crd(name string, served, storage bool) Got[*apiextensionsv1.CustomResourceDefinition] {
	return Got[*apiextensionsv1.CustomResourceDefinition]{Value: &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       apiextensionsv1.CustomResourceDefinitionSpec{Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1alpha1", Served: served, Storage: storage}}},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
			{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}},
	}}
}

func deployment(ns, name, image string, want, avail int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(want), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: image}}}}},
		Status: appsv1.DeploymentStatus{AvailableReplicas: avail},
	}
}

// healthy is a cluster where every check passes: one SidecarInjector
// (Fail, but on labelled namespaces only) and one NodeOversell (2 s).
func healthy(t *testing.T) Facts {
	ca := issue(t, "hookwright-ca", true, 365*24*time.Hour, nil)
	leaf := issue(t, "svc", false, 90*24*time.Hour, ca)
	wh := func(cfg, svc string, fp admissionregistrationv1.FailurePolicyType, to int32, req Request, nsSel *metav1.LabelSelector) admissionregistrationv1.MutatingWebhookConfiguration {
		res := req.Resource
		if req.Subresource != "" {
			res += "/" + req.Subresource
		}
		return admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: cfg, Labels: map[string]string{LabelManagedBy: ManagedByValue}},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{
				Name: cfg + ".hookwright.io", FailurePolicy: &fp, TimeoutSeconds: ptr.To(to), NamespaceSelector: nsSel,
				ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: ca.pem,
					Service: &admissionregistrationv1.ServiceReference{Namespace: "hookwright-system", Name: svc}},
				Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{req.Operation},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{res}}}},
			}},
		}
	}
	labelled := &metav1.LabelSelector{MatchLabels: map[string]string{"sidecar-injection": "enabled"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}}}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hookwright-system", Name: "tls"},
		Data: map[string][]byte{corev1.TLSCertKey: leaf.pem}}
	ready := []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue}, {Type: v1alpha1.ConditionWebhookReachable, Status: metav1.ConditionTrue}}
	slice := []discoveryv1.EndpointSlice{{Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}}}
	return Facts{
		Now:           now,
		ServerVersion: Got[string]{Value: "v1.37.2"},
		CLIVersion:    "v0.1.0",
		CRDs: map[string]Got[*apiextensionsv1.CustomResourceDefinition]{
			CRDNames[0]: crd(CRDNames[0], true, true), CRDNames[1]: crd(CRDNames[1], true, true),
		},
		OperatorNamespace: "hookwright-system",
		Operator:          Got[*appsv1.Deployment]{Value: deployment("hookwright-system", "hookwright-controller-manager", "ghcr.io/hookwright/hookwright:v0.1.0", 2, 2)},
		Lease: Got[*coordinationv1.Lease]{Value: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("pod-a"), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &metav1.MicroTime{Time: now.Add(-3 * time.Second)}}}},
		CRs: Got[[]CR]{Value: []CR{
			{Kind: "SidecarInjector", Name: "si", Generation: 2, ObservedGeneration: 2, Conditions: ready, WebhookConfiguration: "hookwright-sidecar-si",
				Fleet:         &v1alpha1.FleetStatus{FleetCounts: v1alpha1.FleetCounts{MatchedPods: 3, InjectedPods: 3, CurrentPods: 3}},
				ServingSecret: Got[*corev1.Secret]{Value: secret},
				Server:        Got[*appsv1.Deployment]{Value: deployment("hookwright-system", "hookwright-sidecar-si", "ghcr.io/hookwright/hookwright:v0.1.0", 2, 2)}},
			{Kind: "NodeOversell", Name: "no", Generation: 1, ObservedGeneration: 1, Conditions: ready, WebhookConfiguration: "hookwright-oversell-no",
				ServingSecret: Got[*corev1.Secret]{Value: secret},
				Server:        Got[*appsv1.Deployment]{Value: deployment("hookwright-system", "hookwright-oversell-no", "ghcr.io/hookwright/hookwright:v0.1.0", 1, 1)}},
		}},
		MutatingWebhooks: Got[[]admissionregistrationv1.MutatingWebhookConfiguration]{Value: []admissionregistrationv1.MutatingWebhookConfiguration{
			wh("hookwright-sidecar-si", "hookwright-sidecar-si", admissionregistrationv1.Fail, 10, PodCreate, labelled),
			wh("hookwright-oversell-no", "hookwright-oversell-no", admissionregistrationv1.Ignore, 2, NodeStatusUpdate, nil),
		}},
		EndpointSlices: map[string]Got[[]discoveryv1.EndpointSlice]{
			"hookwright-system/hookwright-sidecar-si": {Value: slice}, "hookwright-system/hookwright-oversell-no": {Value: slice},
		},
	}
}

// lines renders results as "status id: message" for the failing and
// warning ones.
func lines(rs []Result) []string {
	var out []string
	for _, r := range rs {
		if r.Status == OK {
			continue
		}
		out = append(out, fmt.Sprintf("%s %s [%s]: %s", r.Status, r.ID, r.Area, r.Message))
	}
	return out
}

// runCase is one cluster for Run: healthy changed by edit.
type runCase struct {
	name string
	edit func(t *testing.T, f *Facts)
	// want are the non-OK lines, each matched as a substring, in order.
	want []string
}

func runCases() []runCase {
	return []runCase{
		{"healthy", func(*testing.T, *Facts) {}, nil},
		{"unreachable", func(_ *testing.T, f *Facts) {
			f.ServerVersion = Got[string]{Err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")}
		}, []string{"fail api-reachable [kubernetes-api]: cannot get /version: dial tcp 127.0.0.1:1: connect: connection refused"}},
		{"no CRDs", func(_ *testing.T, f *Facts) {
			nf := apierrors.NewNotFound(schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}, "x")
			for _, n := range CRDNames {
				f.CRDs[n] = Got[*apiextensionsv1.CustomResourceDefinition]{Err: nf}
			}
			f.CRs = Got[[]CR]{Err: apierrors.NewNotFound(schema.GroupResource{}, "")}
		}, []string{"fail crd-present [hookwright-crds]: not found", "fail crd-present [hookwright-crds]: not found", "skip cr-list"}},
		{"CRD of another version", func(_ *testing.T, f *Facts) {
			f.CRDs[CRDNames[1]].Value.Spec.Versions[0].Name = "v1beta1"
		}, []string{"fail crd-version [hookwright-crds]: versions v1beta1 (served, storage)"}},
		{"webhook configurations forbidden", func(_ *testing.T, f *Facts) {
			f.MutatingWebhooks = Got[[]admissionregistrationv1.MutatingWebhookConfiguration]{Err: forbidden}
		}, []string{
			"fail webhook-config [SidecarInjector si]: forbidden: cannot list mutatingwebhookconfigurations",
			"fail webhook-config [NodeOversell no]: forbidden",
			"fail risky-scope [admission-safety]: forbidden", "fail heartbeat-budget [admission-safety]: forbidden"}},
		{"operator down, leader gone", func(_ *testing.T, f *Facts) {
			f.Operator.Value.Status.AvailableReplicas = 0
			f.Lease.Value.Spec.RenewTime.Time = now.Add(-time.Minute)
		}, []string{"fail operator-replicas [hookwright-operator]: hookwright-system/hookwright-controller-manager: 0 of 2 available",
			"fail operator-leader [hookwright-operator]: leader pod-a last renewed 1m0s ago, past the 15s lease"}},
		{"one replica short", func(_ *testing.T, f *Facts) { f.Operator.Value.Status.AvailableReplicas = 1 },
			[]string{"warn operator-replicas [hookwright-operator]: hookwright-system/hookwright-controller-manager: 1 of 2 available"}},
		{"not ready, probe unknown, lagging", func(_ *testing.T, f *Facts) {
			cr := &f.CRs.Value[0]
			cr.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "ServerUnavailable", Message: "0/2 ready"},
				{Type: v1alpha1.ConditionWebhookReachable, Status: metav1.ConditionUnknown, Reason: "ProbePending", Message: "not yet"}}
			cr.Generation = 3
		}, []string{"fail cr-ready [SidecarInjector si]: ServerUnavailable: 0/2 ready", "warn cr-webhook-reachable [SidecarInjector si]: ProbePending: not yet",
			"warn cr-observed [SidecarInjector si]: generation 3, observed 2"}},
		{"certificate under 30 days, CA expired", func(t *testing.T, f *Facts) {
			ca := issue(t, "old-ca", true, -time.Minute, nil)
			ca.cert.NotBefore = now.Add(-48 * time.Hour)
			f.CRs.Value[1].ServingSecret.Value = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
				Data: map[string][]byte{corev1.TLSCertKey: issue(t, "svc", false, 10*24*time.Hour, nil).pem}}
		}, []string{"warn serving-cert [NodeOversell no]: Secret ns/s valid until 2026-12-15T00:00:00Z (10d left), under 30d",
			"fail webhook-cabundle [NodeOversell no]: none of the 1 CA certificates in the caBundle verifies the serving certificate"}},
		{"CA under 30 days", func(t *testing.T, f *Facts) {
			ca := issue(t, "short-ca", true, 20*24*time.Hour, nil)
			leaf := issue(t, "svc", false, 10*24*time.Hour, ca)
			f.CRs.Value[0].ServingSecret.Value = &corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: leaf.pem}}
			// A rotation in progress: the old CA first, the new one signs.
			old := issue(t, "old-ca", true, 400*24*time.Hour, nil)
			f.MutatingWebhooks.Value[0].Webhooks[0].ClientConfig.CABundle = append(append([]byte{}, old.pem...), ca.pem...)
		}, []string{"warn serving-cert [SidecarInjector si]", `warn webhook-ca [SidecarInjector si]: CA "short-ca" valid until 2026-12-25T00:00:00Z (20d left), under 30d`}},
		{"expired serving certificate", func(t *testing.T, f *Facts) {
			f.Now = now.Add(100 * 24 * time.Hour)
			f.Lease.Value.Spec.RenewTime.Time = f.Now
		}, []string{"fail serving-cert [SidecarInjector si]: Secret hookwright-system/tls expired at 2027-03-05T00:00:00Z",
			"fail webhook-cabundle [SidecarInjector si]", "fail serving-cert [NodeOversell no]", "fail webhook-cabundle [NodeOversell no]"}},
		{"no endpoints, secret missing", func(_ *testing.T, f *Facts) {
			f.EndpointSlices["hookwright-system/hookwright-sidecar-si"] = Got[[]discoveryv1.EndpointSlice]{Value: []discoveryv1.EndpointSlice{
				{Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}}}}}
			f.CRs.Value[1].ServingSecret = Got[*corev1.Secret]{Err: apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "tls")}
		}, []string{"fail webhook-endpoints [SidecarInjector si]: Service hookwright-system/hookwright-sidecar-si has no ready endpoint",
			"fail serving-cert [NodeOversell no]: its Secret is missing", "skip webhook-cabundle [NodeOversell no]"}},
		{"webhook configuration deleted", func(_ *testing.T, f *Facts) {
			f.MutatingWebhooks.Value = f.MutatingWebhooks.Value[1:]
		}, []string{"fail webhook-config [SidecarInjector si]: hookwright-sidecar-si not found"}},
		{"Fail over every namespace", func(_ *testing.T, f *Facts) {
			f.MutatingWebhooks.Value[0].Webhooks[0].NamespaceSelector.MatchLabels = nil
		}, []string{"warn risky-scope [admission-safety]: failurePolicy Fail over every namespace but the excluded ones: hookwright-sidecar-si"}},
		{"heartbeat budget spent", func(_ *testing.T, f *Facts) {
			w := f.MutatingWebhooks.Value[1]
			w.Name = "hookwright-oversell-two"
			w.Webhooks = []admissionregistrationv1.MutatingWebhook{*w.Webhooks[0].DeepCopy()}
			w.Webhooks[0].TimeoutSeconds = ptr.To[int32](8)
			f.MutatingWebhooks.Value = append(f.MutatingWebhooks.Value, w)
		}, []string{"fail heartbeat-budget [admission-safety]: our webhooks on nodes/status: 10s of the kubelet's 10s (hookwright-oversell-no 2s, hookwright-oversell-two 8s)"}},
		{"heartbeat budget shared", func(_ *testing.T, f *Facts) {
			w := *f.MutatingWebhooks.Value[1].DeepCopy()
			w.Name, w.Labels = "other", nil
			w.Webhooks[0].TimeoutSeconds = nil
			f.MutatingWebhooks.Value = append(f.MutatingWebhooks.Value, w)
		}, []string{"warn heartbeat-budget [admission-safety]: our webhooks on nodes/status: 2s of the kubelet's 10s (hookwright-oversell-no 2s); other webhooks add 10s (other 10s)"}},
		{"fleet missing and outdated", func(_ *testing.T, f *Facts) {
			f.CRs.Value[0].Fleet.MissingPods, f.CRs.Value[0].Fleet.OutdatedPods = 1, 2
		}, []string{"warn fleet-missing [sidecar-fleet]: 1 of 3 matched pods", "warn fleet-outdated [sidecar-fleet]: 2 of 3 injected pods"}},
		{"version skew", func(_ *testing.T, f *Facts) {
			f.CRs.Value[1].Server.Value.Spec.Template.Spec.Containers[0].Image = "reg:5000/hookwright@sha256:abc"
		}, []string{"warn version-skew [hookwright-operator]: operator v0.1.0, this CLI v0.1.0; NodeOversell no runs sha256:abc"}},
		{"no CRs", func(_ *testing.T, f *Facts) { f.CRs.Value = nil }, []string{"warn cr-list [hookwright-crds]: none in the cluster"}},
		{"no operator", func(_ *testing.T, f *Facts) {
			f.Operator = Got[*appsv1.Deployment]{Err: apierrors.NewNotFound(schema.GroupResource{}, "")}
			f.Lease = Got[*coordinationv1.Lease]{Err: apierrors.NewNotFound(schema.GroupResource{}, "")}
		}, []string{"fail operator-replicas [hookwright-operator]: no operator Deployment in namespace hookwright-system",
			"fail operator-leader [hookwright-operator]: no leader election Lease in namespace hookwright-system"}},
	}
}

func TestRun(t *testing.T) {
	for _, tc := range runCases() {
		t.Run(tc.name, func(t *testing.T) {
			f := healthy(t)
			tc.edit(t, &f)
			rs := Run(f)
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
