package controllers

import (
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
)

// The fingerprint moves with what a probe depends on, and only with that.
func TestProbeFingerprint(t *testing.T) {
	mk := func(edit func(*v1alpha1.SidecarInjector, *pass, *admissionregistrationv1.MutatingWebhookConfiguration)) string {
		si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh", Generation: 3}}
		p := &pass{op: desired.NewCR(desired.SidecarKind, si), cert: sources.State{NotAfter: time.Unix(1000, 0)}}
		wh := &admissionregistrationv1.MutatingWebhookConfiguration{Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "w", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: []byte("ca1")},
		}}}
		apimeta.SetStatusCondition(&si.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionServerAvailable, Status: metav1.ConditionTrue, Reason: "x", Message: "1 of 1"})
		edit(si, p, wh)
		return probeFingerprint(p, wh)
	}
	base := mk(func(*v1alpha1.SidecarInjector, *pass, *admissionregistrationv1.MutatingWebhookConfiguration) {})
	for name, edit := range map[string]func(*v1alpha1.SidecarInjector, *pass, *admissionregistrationv1.MutatingWebhookConfiguration){
		"generation": func(si *v1alpha1.SidecarInjector, _ *pass, _ *admissionregistrationv1.MutatingWebhookConfiguration) {
			si.Generation = 4
		},
		"caBundle": func(_ *v1alpha1.SidecarInjector, _ *pass, wh *admissionregistrationv1.MutatingWebhookConfiguration) {
			wh.Webhooks[0].ClientConfig.CABundle = []byte("ca2")
		},
		"certificate": func(_ *v1alpha1.SidecarInjector, p *pass, _ *admissionregistrationv1.MutatingWebhookConfiguration) {
			p.cert.NotAfter = time.Unix(2000, 0)
		},
		"availability": func(si *v1alpha1.SidecarInjector, _ *pass, _ *admissionregistrationv1.MutatingWebhookConfiguration) {
			apimeta.SetStatusCondition(&si.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionServerAvailable, Status: metav1.ConditionFalse, Reason: "x", Message: "0 of 1"})
		},
	} {
		if mk(edit) == base {
			t.Errorf("%s: fingerprint unchanged", name)
		}
	}
	unrelated := mk(func(si *v1alpha1.SidecarInjector, _ *pass, _ *admissionregistrationv1.MutatingWebhookConfiguration) {
		apimeta.SetStatusCondition(&si.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionConfigLoaded, Status: metav1.ConditionTrue, Reason: "x"})
	})
	if unrelated != base {
		t.Error("fingerprint moved with ConfigLoaded")
	}
}
