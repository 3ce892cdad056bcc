package desired

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Names of the manager's validating webhook.
const (
	// ValidatingConfigName is the cluster-scoped ValidatingWebhookConfiguration.
	ValidatingConfigName = "hookwright-validation"
	// ValidatingWebhookName is its single webhook.
	ValidatingWebhookName = "validate.admission.hookwright.io"
	// ManagerCertSecretName is the manager's serving certificate Secret in
	// the operator namespace (type kubernetes.io/tls).
	ManagerCertSecretName = "hookwright-webhook-server-cert"
	// DefaultWebhookService is the manager's webhook Service of config/webhook
	// (kustomize prefix "hookwright-").
	DefaultWebhookService = "hookwright-webhook-service"
	// MatchSpecChange is the validating webhook's matchCondition that
	// sends it only creates and spec changes.
	MatchSpecChange = "spec-changed"
	// ManagerWebhookPort is the manager's webhook server port (the Service's
	// targetPort "webhook-server").
	ManagerWebhookPort = 9443
)

// ValidatingWebhookConfiguration builds the manager's configuration: one
// webhook calling service ns/svc at path for CREATE and UPDATE of
// SidecarInjector and NodeOversell, not matching objects being deleted; no
// caBundle (internal/certificates/sources.PublishValidating writes it).
func ValidatingWebhookConfiguration(ns, svc, path string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	scope := admissionregistrationv1.ClusterScope
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ValidatingConfigName, Labels: map[string]string{
			LabelManagedBy: ManagedByValue, labelName: "hookwright", LabelComponent: "validation",
		}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: ValidatingWebhookName,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svc, Path: ptr.To(path), Port: ptr.To[int32](443)},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{v1alpha1.GroupVersion.Version},
					Resources: []string{"sidecarinjectors", "nodeoversells"}, Scope: &scope,
				},
			}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name: "not-being-deleted", Expression: "!has(object.metadata.deletionTimestamp)",
			}, {
				// Only a create or a spec change is validated: metadata
				// (the pause annotation, labels, finalizers) and status
				// writes never wait on the manager, so break-glass works
				// while the operator is down (Gatekeeper's failing-closed
				// docs). The reconciler checks the spec again anyway.
				Name: MatchSpecChange, Expression: "request.operation != 'UPDATE' || object.spec != oldObject.spec",
			}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// ManagerCertSecret is the manager's serving certificate Secret in
// namespace (type kubernetes.io/tls, no ca.crt).
func ManagerCertSecret(namespace string, certPEM, keyPEM []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: ManagerCertSecretName, Labels: map[string]string{
			LabelManagedBy: ManagedByValue, labelName: "hookwright", LabelComponent: "validation",
		}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}
}
