package controllers

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certs"
)

// selfSigned runs the certificate planner for op over the whole
// installation (every SelfSigned CR of both kinds), writes the CA Secret
// when the plan changed it, records an Event per CA step, and returns op's
// share: its serving Secret and caBundle. Holding the shared lock, the two
// reconcilers never plan on the same CA Secret at once; the Secret is read
// from the API (not the cache) and written with an optimistic lock.
func (r *Reconciler) selfSigned(ctx context.Context, op Operand, now time.Time) (CertState, error) {
	r.shared.caMu.Lock()
	defer r.shared.caMu.Unlock()

	key := client.ObjectKey{Namespace: r.Settings.Namespace, Name: CASecretName}
	caSec := &corev1.Secret{}
	switch err := r.APIReader.Get(ctx, key, caSec); {
	case apierrors.IsNotFound(err):
		caSec = nil
	case err != nil:
		return CertState{}, err
	}
	var caData map[string][]byte
	if caSec != nil {
		caData = caSec.Data
	}
	extra := r.shared.caDir.Bundle()
	in := CertInputs{
		Own: servingKey(op, r.Settings), OwnConfig: op.Kind.BaseName(op.Object.GetName()),
		Extra: extra, Now: now, Settings: r.Settings.Certificates,
		State: certs.State{CA: caData, Published: map[string][]byte{}, Serving: map[string]certs.Serving{}},
	}
	ops, err := r.selfSignedOperands(ctx)
	if err != nil {
		return CertState{}, err
	}
	var current *corev1.Secret
	for _, o := range ops {
		sec := &corev1.Secret{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ServerNamespace(o, r.Settings), Name: ServingSecretName(o)}, sec); err != nil {
			if !apierrors.IsNotFound(err) {
				return CertState{}, err
			}
			sec = nil
		}
		k := servingKey(o, r.Settings)
		in.State.Serving[k] = servingOf(o, r.Settings, sec)
		if sec != nil {
			d, _ := DrainingFromAnnotations(sec.Annotations, now)
			in.State.Draining = append(in.State.Draining, splitPEM(d)...)
		}
		if k == in.Own {
			current = sec
		}
		name := o.Kind.BaseName(o.Object.GetName())
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: name}, mwc); {
		case apierrors.IsNotFound(err):
			// Not created yet: it is created with the current bundle.
		case err != nil:
			return CertState{}, err
		default:
			var b []byte
			if len(mwc.Webhooks) > 0 {
				b = mwc.Webhooks[0].ClientConfig.CABundle
			}
			in.State.Published[name] = PlannerView(b, extra, caData)
		}
	}
	if _, ok := in.State.Serving[in.Own]; !ok {
		// Not in the cache's list yet (just created): it still counts.
		in.State.Serving[in.Own] = servingOf(op, r.Settings, nil)
	}

	out, err := AdvanceCertificates(in)
	if err != nil {
		return CertState{}, err
	}
	if out.CA != nil && !maps.EqualFunc(out.CA, caData, bytes.Equal) {
		if err := r.writeCA(ctx, key, caSec, out.CA); err != nil {
			return CertState{}, err
		}
	}
	for _, st := range out.Steps {
		switch {
		case st.Kind == certs.StepIssueServing:
			// Reported as CertificateIssued once the Secret is written.
		case st.Kind == certs.StepPublishBundle && !st.Rotating:
			// Routine (a new or repaired configuration), not a rotation step.
		default:
			log.FromContext(ctx).Info("certificate step", "step", st.Kind, "reason", st.Reason, "message", st.Message)
			r.Recorder.Eventf(op.Object, nil, corev1.EventTypeNormal, EventCARotation, string(st.Kind), "%s (%s): %s", st.Kind, st.Reason, st.Message)
		}
	}
	return certStateFrom(op, r.Settings, out, current, now), nil
}

// writeCA creates the CA Secret (cur nil) or patches it to data with an
// optimistic lock, so a concurrent writer makes this reconcile retry
// instead of one CA overwriting another.
func (r *Reconciler) writeCA(ctx context.Context, key client.ObjectKey, cur *corev1.Secret, data map[string][]byte) error {
	var owners []metav1.OwnerReference
	if r.APIReader != nil {
		var err error
		if owners, err = InstallationOwners(ctx, r.APIReader); err != nil {
			return err
		}
	}
	return writeCASecret(ctx, r.Client, key, cur, data, owners)
}

// writeCASecret is writeCA with an explicit client (the manager's
// validating webhook reconciler creates the CA when no CR has).
// The Secret is owned by the InstallationCRDs (owners; see installowners.go).
func writeCASecret(ctx context.Context, c client.Client, key client.ObjectKey, cur *corev1.Secret, data map[string][]byte, owners []metav1.OwnerReference) error {
	if cur == nil {
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{
				LabelManagedBy: ManagedByValue, LabelName: "hookwright", LabelComponent: "ca",
			}, OwnerReferences: owners},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if err := c.Create(ctx, sec, client.FieldOwner(FieldManager)); err != nil {
			return fmt.Errorf("create CA Secret %s: %w", key, err)
		}
		return nil
	}
	next := cur.DeepCopy()
	next.Data = data
	if next.Labels == nil {
		next.Labels = map[string]string{}
	}
	next.Labels[LabelManagedBy] = ManagedByValue
	next.OwnerReferences = append(next.OwnerReferences, MissingOwners(next.OwnerReferences, owners)...)
	patch := client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{})
	if err := c.Patch(ctx, next, patch, client.FieldOwner(FieldManager)); err != nil {
		return fmt.Errorf("update CA Secret %s: %w", key, err)
	}
	return nil
}

// selfSignedOperands lists the CRs of both kinds (from the cache) whose
// certificates the operator issues, except those being deleted and those
// the server policy refuses (their server is not the operator's, and their
// namespace may be outside its cache and RBAC).
func (r *Reconciler) selfSignedOperands(ctx context.Context) ([]Operand, error) {
	var ops []Operand
	var sis v1alpha1.SidecarInjectorList
	if err := r.Client.List(ctx, &sis); err != nil {
		return nil, err
	}
	for i := range sis.Items {
		ops = append(ops, SidecarOperand(&sis.Items[i]))
	}
	var nos v1alpha1.NodeOversellList
	if err := r.Client.List(ctx, &nos); err != nil {
		return nil, err
	}
	for i := range nos.Items {
		ops = append(ops, OversellOperand(&nos.Items[i]))
	}
	out := ops[:0]
	pol := r.Settings.ServerPolicy()
	for _, o := range ops {
		if CertificateMode(o) == v1alpha1.CertificateSelfSigned && o.Object.GetDeletionTimestamp().IsZero() && len(pol.Check(o.Server, o.Certificate)) == 0 {
			out = append(out, o)
		}
	}
	return out, nil
}
