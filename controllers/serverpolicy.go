package controllers

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// ReasonServerNotAllowed (Ready, WebhookConfigured) and the Warning Event
// of the same name: the CR's server breaks the operator's server policy
// (Settings.ServerPolicy), so the operator does not act on it.
const ReasonServerNotAllowed = "ServerNotAllowed"

// refuse handles a CR whose server the policy does not allow (admitted
// before the validating webhook existed, while it was down, or before the
// operator's flags were narrowed): nothing is created or repaired for it,
// and its webhook configuration, if the operator wrote one, loses its
// webhooks, so the API server stops sending objects to a server the
// operator does not vouch for (an unknown image would see every pod, or
// every node status write). Ready says which field breaks which rule.
func (r *reconciler) refuse(ctx context.Context, op desired.CR, errs field.ErrorList) error {
	msg := "not acted on: " + errs.ToAggregate().Error()
	if c := apimeta.FindStatusCondition(op.Conditions(), v1alpha1.ConditionReady); c == nil || c.Reason != ReasonServerNotAllowed || c.Message != msg {
		log.FromContext(ctx).Info("server not allowed by the operator's policy", "problems", errs.ToAggregate().Error())
		r.Recorder.Eventf(op.Object, nil, corev1.EventTypeWarning, ReasonServerNotAllowed, "Reconcile", msg)
	}
	r.setCondition(op, v1alpha1.ConditionReady, false, ReasonServerNotAllowed, msg)
	name := op.Base()
	exists, removed, err := r.disarm(ctx, op, name)
	if err != nil {
		return err
	}
	if removed {
		r.Recorder.Eventf(op.Object, nil, corev1.EventTypeWarning, ReasonServerNotAllowed, "Disarm",
			"removed the webhooks of MutatingWebhookConfiguration %s: the server policy does not allow this server", name)
	}
	if exists {
		r.setCondition(op, v1alpha1.ConditionWebhookConfigured, false, ReasonServerNotAllowed,
			"MutatingWebhookConfiguration "+name+" has no webhooks: the server policy does not allow this server")
	}
	return nil
}

// disarm removes the webhooks of the CR's configuration name when the CR
// controls it, so the API server calls its server no more (a merge patch:
// the operator holds no delete permission on webhook configurations; the
// garbage collector deletes the configuration with the CR). It reports
// whether the configuration exists and whether this call removed webhooks.
func (r *reconciler) disarm(ctx context.Context, op desired.CR, name string) (exists, removed bool, err error) {
	live := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, live); err != nil {
		if apierrors.IsNotFound(err) {
			return false, false, nil
		}
		return false, false, err
	}
	if !metav1.IsControlledBy(live, op.Object) {
		return false, false, nil
	}
	if len(live.Webhooks) == 0 {
		return true, false, nil
	}
	if err := r.Client.Patch(ctx, live, client.RawPatch(types.MergePatchType, []byte(`{"webhooks":null}`))); err != nil {
		if apierrors.IsNotFound(err) {
			return false, false, nil
		}
		return false, false, fmt.Errorf("remove the webhooks of MutatingWebhookConfiguration %s: %w", name, err)
	}
	// The next apply of this configuration (once the CR is allowed) is a
	// change of the desired state, not drift.
	r.applier.ForgetObject(owner(op), "MutatingWebhookConfiguration", live)
	return true, true, nil
}
