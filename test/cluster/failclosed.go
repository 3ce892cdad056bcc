package cluster

import (
	"context"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/desired"
)

// FailClosed names ("configuration/webhook") the webhooks of every
// hookwright-managed webhook configuration (the CRs' mutating ones and the
// manager's validating one) whose failurePolicy is not Ignore; nil counts
// as Fail, the admissionregistration/v1 default. None means an uninstall
// left nothing that can refuse an admission.
func FailClosed(ctx context.Context, c client.Reader) ([]string, error) {
	var out []string
	mwcs := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	if err := c.List(ctx, mwcs, client.MatchingLabels{desired.LabelManagedBy: desired.ManagedByValue}); err != nil {
		return nil, err
	}
	for _, m := range mwcs.Items {
		for _, w := range m.Webhooks {
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
				out = append(out, m.Name+"/"+w.Name)
			}
		}
	}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	switch err := c.Get(ctx, client.ObjectKey{Name: desired.ValidatingConfigName}, v); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, err
	default:
		for _, w := range v.Webhooks {
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
				out = append(out, v.Name+"/"+w.Name)
			}
		}
	}
	return out, nil
}
