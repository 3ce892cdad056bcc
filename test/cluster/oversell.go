package cluster

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// OversellWebhook is the MutatingWebhookConfiguration name for a test
// that runs the oversell server itself rather than through the operator:
// one webhook, webhook, on every UPDATE of nodes/status, sent to the
// Service ns/svc on port 443 at /oversell with caPEM as its caBundle,
// failurePolicy Ignore (a down server never holds a node's status back),
// matchPolicy Equivalent and a timeout of timeout seconds. A test that
// shares the cluster with other nodes narrows it with an ObjectSelector.
func OversellWebhook(name, webhook, ns, svc string, caPEM []byte, timeout int32) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: webhook,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svc, Path: ptr.To("/oversell"), Port: ptr.To[int32](443)},
				CABundle: caPEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes/status"}},
			}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To(timeout),
		}},
	}
}
