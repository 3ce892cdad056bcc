package operator

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// The manager's validating webhook, served in-process and reached by the
// API server through the webhook Service (EgressProxy route): a bad CR is
// rejected at apply time with the template name and line; a good one is
// admitted; the configuration matches only CREATE/UPDATE of the two kinds
// and is restored when deleted.
func TestValidatingWebhookRejectsBadCRs(t *testing.T) {
	ctx := cluster.TestContext(t, 3*time.Minute)
	c := env.Client
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	key := client.ObjectKey{Name: desired.ValidatingConfigName}
	err := cluster.WaitFor(ctx, 60*time.Second, "ValidatingWebhookConfiguration with a caBundle", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, vwc); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return len(vwc.Webhooks) == 1 && len(vwc.Webhooks[0].ClientConfig.CABundle) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	w := vwc.Webhooks[0]
	if *w.FailurePolicy != admissionregistrationv1.Fail || len(w.Rules) != 1 || len(w.MatchConditions) != 2 ||
		strings.Join(w.Rules[0].Resources, ",") != "sidecarinjectors,nodeoversells" || len(w.Rules[0].Operations) != 2 ||
		*w.Rules[0].Scope != admissionregistrationv1.ClusterScope {
		t.Fatalf("webhook %+v", w)
	}
	// Owned by both CRDs, as are the manager's serving Secret and the CA
	// Secret: an uninstall that deletes the CRDs deletes them (see
	// controllers/installowners.go; test/olm's cleanup test shows it).
	owners, err := sources.InstallationOwners(ctx, c)
	if err != nil || len(owners) != 2 {
		t.Fatalf("installation owners %v, %v", owners, err)
	}
	for k, obj := range map[client.ObjectKey]client.Object{
		key: &admissionregistrationv1.ValidatingWebhookConfiguration{},
		{Namespace: operatorNS, Name: desired.ManagerCertSecretName}: &corev1.Secret{},
		{Namespace: operatorNS, Name: desired.CASecretName}:          &corev1.Secret{},
	} {
		if err := c.Get(ctx, k, obj); err != nil {
			t.Fatal(err)
		}
		if missing := sources.MissingOwners(obj.GetOwnerReferences(), owners); len(missing) > 0 {
			t.Errorf("%s lacks owner references %v (has %v)", k, missing, obj.GetOwnerReferences())
		}
	}
	dry := client.DryRunAll

	// Retried: the API server may not have seen the configuration or the
	// certificate may not be served yet right after startup.
	var denied error
	start := time.Now()
	bad := cluster.SampleInjector(t, "bad-template")
	bad.Spec.Templates = []v1alpha1.NamedTemplate{{Name: "proxy", Template: "spec:\n  containers:\n  - name: proxy\n    image: {{ nosuchfunc }}\n"}}
	bad.Spec.DefaultTemplates = []string{"proxy"}
	err = cluster.WaitFor(ctx, 60*time.Second, "bad SidecarInjector denied by the webhook", func(ctx context.Context) (bool, error) {
		denied = c.Create(ctx, bad.DeepCopy(), dry)
		return denied != nil && strings.Contains(denied.Error(), "denied the request"), nil
	})
	if err != nil {
		t.Fatalf("%v; last error %v", err, denied)
	}
	t.Logf("bad SidecarInjector denied after %s: %v", time.Since(start).Round(time.Millisecond), denied)
	for _, want := range []string{desired.ValidatingWebhookName, "SidecarInjector bad-template", "template: proxy:4:", "nosuchfunc"} {
		if !strings.Contains(denied.Error(), want) {
			t.Errorf("denial %q lacks %q", denied, want)
		}
	}
	if !apierrors.IsInvalid(denied) {
		t.Errorf("denial is not 422 Invalid: %v", denied)
	}

	good := cluster.SampleInjector(t, "good-template")
	if err := c.Create(ctx, good, dry); err != nil {
		t.Fatalf("sample SidecarInjector: %v", err)
	}

	no := &v1alpha1.NodeOversell{ObjectMeta: metav1.ObjectMeta{Name: "bad-selector"}, Spec: v1alpha1.NodeOversellSpec{
		Ratios:       v1alpha1.OversellRatios{CPU: "2"},
		NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pool", Operator: metav1.LabelSelectorOpIn}}},
	}}
	err = c.Create(ctx, no.DeepCopy(), dry)
	if err == nil || !strings.Contains(err.Error(), "spec.nodeSelector") {
		t.Fatalf("NodeOversell with In and no values: %v", err)
	}
	t.Logf("bad NodeOversell denied: %v", err)
	no.Spec.NodeSelector = nil
	if err := c.Create(ctx, no, dry); err != nil {
		t.Fatalf("good NodeOversell: %v", err)
	}

	// Deleted (a GitOps prune, a careless kubectl): restored.
	before := vwc.DeepCopy()
	if err := c.Delete(ctx, vwc); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	err = cluster.WaitFor(ctx, 30*time.Second, "ValidatingWebhookConfiguration recreated", func(ctx context.Context) (bool, error) {
		got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := c.Get(ctx, key, got); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return got.UID != before.UID && len(got.Webhooks) == 1 && len(got.Webhooks[0].ClientConfig.CABundle) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted ValidatingWebhookConfiguration recreated in %s", time.Since(deleted).Round(time.Millisecond))

	// The serving certificate chains to a CA the configuration publishes.
	srv, err := certsFromSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyServing(srv, got.Webhooks[0].ClientConfig.CABundle, desired.DefaultWebhookService+"."+operatorNS+".svc", time.Now()); err != nil {
		t.Fatalf("manager serving certificate vs caBundle: %v", err)
	}
}

func certsFromSecret(ctx context.Context) (*x509.Certificate, error) {
	s := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: desired.ManagerCertSecretName}, s); err != nil {
		return nil, err
	}
	return pki.ParseCertPEM(s.Data["tls.crt"])
}
