package operator

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

func injected(p *corev1.Pod) bool { return p.Annotations[v1alpha1.SidecarStatusKey] != "" }

func TestSidecarInjectorLifecycle(t *testing.T) {
	ctx := cluster.TestContext(t, 6*time.Minute)
	c := env.Client
	si := cluster.SampleInjector(t, "mesh")
	create(t, ctx, si)
	created := time.Now()
	conds := func() []metav1.Condition { return si.Status.Conditions }
	waitConditions(t, ctx, si, conds, configured, 60*time.Second)
	t.Logf("certificate and webhook configured %s after create", time.Since(created).Round(time.Millisecond))
	// kwok runs the Deployment's pods, so the server becomes available.
	waitConditions(t, ctx, si, conds, map[string]metav1.ConditionStatus{
		v1alpha1.ConditionServerAvailable: metav1.ConditionTrue, v1alpha1.ConditionReady: metav1.ConditionTrue,
	}, 90*time.Second)
	t.Logf("Ready %s after create; conditions:%s", time.Since(created).Round(time.Millisecond), fmtConds(si.Status.Conditions))
	if si.Status.ObservedGeneration != si.Generation {
		t.Fatalf("observedGeneration %d, generation %d", si.Status.ObservedGeneration, si.Generation)
	}

	base := desired.SidecarKind.BaseName(si.Name)
	o := ownedKeys(base, operatorNS)
	o.fetch(t, ctx, "SidecarInjector", si.UID)

	// The CA Secret and the serving certificate behind the caBundle.
	ca := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: desired.CASecretName}, ca); err != nil {
		t.Fatal(err)
	}
	caBundle := ca.Data[pki.SecretKeyBundle]
	if o.Secret.Type != corev1.SecretTypeTLS || !bytes.Equal(o.Secret.Data["ca.crt"], caBundle) {
		t.Fatalf("serving Secret type %s, ca.crt equal to the CA bundle: %v", o.Secret.Type, bytes.Equal(o.Secret.Data["ca.crt"], caBundle))
	}
	leaf, err := pki.ParseCertPEM(o.Secret.Data[corev1.TLSCertKey])
	if err != nil {
		t.Fatal(err)
	}
	wantSANs := []string{base + "." + operatorNS + ".svc", base + "." + operatorNS + ".svc.cluster.local"}
	if !slices.Equal(leaf.DNSNames, wantSANs) {
		t.Fatalf("SANs %v, want %v", leaf.DNSNames, wantSANs)
	}
	if err := pki.VerifyServing(leaf, caBundle, wantSANs[0], time.Now()); err != nil {
		t.Fatal(err)
	}
	if c := metaCond(si.Status.Conditions, v1alpha1.ConditionCertificateReady); !strings.Contains(c, leaf.NotAfter.UTC().Format(time.RFC3339)) {
		t.Fatalf("CertificateReady message %q lacks notAfter %s", c, leaf.NotAfter.UTC().Format(time.RFC3339))
	}

	// Webhook configuration.
	if len(o.MWC.Webhooks) != 1 {
		t.Fatalf("%d webhooks", len(o.MWC.Webhooks))
	}
	wh := o.MWC.Webhooks[0]
	if !bytes.Equal(wh.ClientConfig.CABundle, caBundle) {
		t.Fatal("caBundle is not the CA Secret's ca.crt")
	}
	if s := wh.ClientConfig.Service; s == nil || s.Name != base || s.Namespace != operatorNS || *s.Path != "/inject" || *s.Port != 443 {
		t.Fatalf("service reference %+v", s)
	}
	// Fail is asked for; Ignore is published until the server is
	// Available and answers the probe (none runs here).
	if *wh.FailurePolicy != admissionregistrationv1.Ignore || *wh.SideEffects != admissionregistrationv1.SideEffectClassNone ||
		*wh.MatchPolicy != admissionregistrationv1.Equivalent || *wh.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy ||
		*wh.TimeoutSeconds != v1alpha1.DefaultSidecarTimeoutSeconds || !slices.Equal(wh.AdmissionReviewVersions, []string{"v1"}) {
		t.Fatalf("webhook settings %+v", wh)
	}
	if r := wh.Rules; len(r) != 1 || !slices.Equal(r[0].Resources, []string{"pods"}) || !slices.Equal(r[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) {
		t.Fatalf("rules %+v", r)
	}
	sel := wh.NamespaceSelector
	if sel.MatchLabels["sidecar-injection"] != "enabled" || len(sel.MatchExpressions) != 1 ||
		// Every allowed server namespace is excluded, not only this CR's,
		// and the installation's excluded namespaces (--excluded-namespaces).
		!slices.Equal(sel.MatchExpressions[0].Values, []string{"kube-system", "kube-public", "kube-node-lease", operatorNS, serverNS, excludedNS}) {
		t.Fatalf("namespaceSelector %+v", sel)
	}

	// Deployment.
	dep := o.Deploy
	ct := dep.Spec.Template.Spec.Containers[0]
	if *dep.Spec.Replicas != 2 || ct.Image != serverImage || ct.Args[0] != "injector" || ct.Args[1] != "--injector=mesh" {
		t.Fatalf("deployment replicas %d image %s args %v", *dep.Spec.Replicas, ct.Image, ct.Args)
	}
	sc := ct.SecurityContext
	if !*sc.RunAsNonRoot || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		dep.Spec.Template.Spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Fatalf("security context %+v", sc)
	}
	if v := dep.Spec.Template.Spec.Volumes[0]; v.Secret.SecretName != base+"-tls" || !ct.VolumeMounts[0].ReadOnly {
		t.Fatalf("serving cert volume %+v mount %+v", v, ct.VolumeMounts[0])
	}
	if o.PDB.Spec.MinAvailable.IntValue() != 1 {
		t.Fatalf("PDB minAvailable %v", o.PDB.Spec.MinAvailable)
	}
	for _, r := range o.Role.Rules {
		for _, s := range append(append(append([]string{}, r.Verbs...), r.Resources...), r.APIGroups...) {
			if s == "*" {
				t.Fatalf("wildcard in ClusterRole rule %+v", r)
			}
		}
	}

	// End to end: the real injector, with the operator's certificate, its
	// Deployment's args, and the RBAC of its ServiceAccount, behind the
	// operator's Service; a pod created through the API server gets injected.
	kc := serviceAccountKubeconfig(t, t.TempDir(), operatorNS, base)
	srv := startLocalServer(t, "injector", ct.Args, o.Secret.Data[corev1.TLSCertKey], o.Secret.Data[corev1.TLSPrivateKeyKey], kc)
	srv.follow(t, o.Secret)
	if err := env.RouteService(o.Svc, srv.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.UnrouteService(o.Svc) })
	if _, err := env.CreateNamespace(ctx, "mesh-apps", map[string]string{"sidecar-injection": "enabled"}); err != nil {
		t.Fatal(err)
	}
	admit := func(what string) {
		t.Helper()
		err := cluster.WaitFor(ctx, 30*time.Second, what, func(ctx context.Context) (bool, error) {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: "mesh-apps"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.23-alpine"}}},
			}
			if err := c.Create(ctx, p, client.DryRunAll); err != nil {
				return false, err
			}
			return injected(p), nil
		})
		if err != nil {
			t.Fatalf("%v\ninjector log:\n%s", err, srv.proc.Tail(3000))
		}
	}
	admit("a pod injected through the operator's Service and caBundle")

	// Drift: a foreign CA in caBundle (a GitOps sync of an old manifest).
	other, err := cluster.NewTestCA("foreign")
	if err != nil {
		t.Fatal(err)
	}
	restored := func(check func(*admissionregistrationv1.MutatingWebhookConfiguration) bool) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			m := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(o.MWC), m); err != nil {
				return false, err
			}
			return check(m), nil
		}
	}
	const repairLimit = 10 * time.Second
	tamper := func(what string, edit func(*admissionregistrationv1.MutatingWebhookConfiguration), ok func(*admissionregistrationv1.MutatingWebhookConfiguration) bool) time.Duration {
		t.Helper()
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(o.MWC), m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		if err := c.Update(ctx, m); err != nil {
			t.Fatal(err)
		}
		// Repaired on the watch event (within 1 s on an idle machine), not
		// by a later periodic reconcile (the probe's, a minute apart): the
		// limit is ten times that, the time a figure.
		return timeWithin(t, ctx, what+" repaired", repairLimit, restored(ok))
	}
	caOK := func(m *admissionregistrationv1.MutatingWebhookConfiguration) bool {
		return bytes.Equal(m.Webhooks[0].ClientConfig.CABundle, caBundle)
	}
	tamper("caBundle replaced by a foreign CA", func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
		m.Webhooks[0].ClientConfig.CABundle = other.CertPEM
	}, caOK)
	tamper("caBundle wiped", func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
		m.Webhooks[0].ClientConfig.CABundle = nil
	}, caOK)
	tamper("system namespaces exclusion removed and rule widened", func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
		m.Webhooks[0].NamespaceSelector.MatchExpressions = nil
		m.Webhooks[0].Rules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	}, func(m *admissionregistrationv1.MutatingWebhookConfiguration) bool {
		w := m.Webhooks[0]
		return len(w.NamespaceSelector.MatchExpressions) == 1 && len(w.Rules[0].Operations) == 1
	})
	// Deleted outright: recreated.
	if err := c.Delete(ctx, o.MWC.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	timeWithin(t, ctx, "deleted MutatingWebhookConfiguration recreated", repairLimit, restored(caOK))
	admit("a pod injected after the repairs")

	// Events on create and on drift repaired.
	var reasons map[string]int
	err = cluster.WaitFor(ctx, 60*time.Second, "Created, DriftRepaired and CertificateIssued events", func(ctx context.Context) (bool, error) {
		reasons, err = eventReasons(ctx, "SidecarInjector", si.Name)
		// 8 objects created, the MWC once more; the MWC repaired 3 times (one series).
		return reasons[apply.EventCreated] >= 8 && reasons[apply.EventDriftRepaired] >= 1 && reasons[sources.EventCertificateIssued] >= 1, err
	})
	if err != nil {
		t.Fatalf("%v: %v", err, reasons)
	}
	t.Logf("events by reason (distinct related objects): %v", reasons)

	// Nothing changes (once both replicas are available): no write at all.
	err = cluster.WaitFor(ctx, 60*time.Second, "2 of 2 replicas in ServerAvailable", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, err
		}
		return strings.Contains(metaCond(si.Status.Conditions, v1alpha1.ConditionServerAvailable), "2 of 2 replicas available"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The live check has seen the server routed (probes back off while
	// it was not): its outcome is settled, so no status write is pending.
	waitReachable(t, ctx, si, metav1.ConditionTrue, nil, 3*time.Minute)
	quiet(t, time.Minute)

	// Deleting the CR garbage-collects everything it owns.
	if err := c.Delete(ctx, si); err != nil {
		t.Fatal(err)
	}
	gc := o.waitGone(t, ctx)
	t.Logf("all 8 owned objects garbage-collected %s after the SidecarInjector was deleted", gc.Round(time.Millisecond))
}

func metaCond(cs []metav1.Condition, typ string) string {
	for _, c := range cs {
		if c.Type == typ {
			return c.Message
		}
	}
	return ""
}
