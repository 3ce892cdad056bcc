package sources

import (
	"context"
	"fmt"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

// CertificateReady reasons of mode CertManager.
const (
	// ReasonCertManagerNotInstalled: the API server does not serve
	// cert-manager.io/v1 Certificates (cert-manager's CRDs are missing).
	ReasonCertManagerNotInstalled = "CertManagerNotInstalled"
	// ReasonCertificatePending: the Certificate has no Ready condition yet,
	// or its Secret is not there yet.
	ReasonCertificatePending = "CertificatePending"
	// reasonCertificateNotReady: cert-manager reports Ready=False.
	reasonCertificateNotReady = "CertificateNotReady"
)

// certManagerRecheck is how often the operator looks again for
// cert-manager's CRDs while they are missing: slow enough not to loop hot,
// quick enough that installing cert-manager is noticed soon.
const certManagerRecheck = 30 * time.Second

// certManagerGroupKind is the cert-manager Certificate kind, whose presence
// in discovery means cert-manager's CRDs are installed.
var certManagerGroupKind = schema.GroupKind{Group: cmapi.SchemeGroupVersion.Group, Kind: cmapi.CertificateKind}

// certManager is mode CertManager: cert-manager issues the serving
// certificate from a Certificate the operator owns.
type certManager struct{ env Env }

// Certificate applies cr's Issuer and Certificate and reads their state.
// Without cert-manager's CRDs it says so (a Warning Event the first time)
// and looks again after certManagerRecheck.
func (m *certManager) Certificate(ctx context.Context, cr desired.CR, apply Apply) (State, error) {
	objs := desired.CertManagerObjects(cr, m.env.Settings)
	keep := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		keep = append(keep, o)
	}
	ok, err := m.installed()
	if err != nil {
		return State{}, err
	}
	if !ok {
		st := State{Reason: ReasonCertManagerNotInstalled, RequeueAfter: certManagerRecheck, Keep: keep, Message: fmt.Sprintf(
			"certificate mode CertManager: the API server does not serve %s/%s %s; install cert-manager (checking again every %s)",
			certManagerGroupKind.Group, cmapi.SchemeGroupVersion.Version, certManagerGroupKind.Kind, certManagerRecheck)}
		if c := apimeta.FindStatusCondition(cr.Conditions(), v1alpha1.ConditionCertificateReady); c == nil || c.Reason != st.Reason {
			m.env.Recorder.Eventf(cr.Object, nil, corev1.EventTypeWarning, EventCertManagerNotInstalled, "Reconcile", st.Message)
		}
		return st, nil
	}
	if m.env.WatchCertManager != nil {
		if err := m.env.WatchCertManager(); err != nil {
			return State{}, fmt.Errorf("watch cert-manager Certificates: %w", err)
		}
	}
	for _, o := range keep {
		if err := apply(ctx, o); err != nil {
			return State{}, err
		}
	}
	want := desired.CertManagerCertificate(cr, m.env.Settings)
	crt := &cmapi.Certificate{}
	found, err := getOrNil(ctx, m.env.Client, client.ObjectKeyFromObject(want), crt)
	if err != nil {
		return State{}, err
	}
	if !found {
		crt = nil
	}
	// cert-manager's Secret carries no operator label, so it is not in the
	// cache: read it directly. A change of it comes with a Certificate
	// status change (revision, notAfter), which re-queues the CR.
	sec, err := secretOrNil(ctx, m.env.APIReader, client.ObjectKey{Namespace: want.Namespace, Name: want.Spec.SecretName})
	if err != nil {
		return State{}, err
	}
	st := certManagerState(cr, m.env.Settings, crt, sec, m.env.Certificates.Now())
	st.Keep = keep
	return st, nil
}

// installed reports whether the API server serves cert-manager.io/v1
// Certificates (the manager's RESTMapper re-reads discovery for a group it
// has not seen).
func (m *certManager) installed() (bool, error) {
	_, err := m.env.Client.RESTMapper().RESTMapping(certManagerGroupKind, cmapi.SchemeGroupVersion.Version)
	switch {
	case err == nil:
		return true, nil
	case apimeta.IsNoMatchError(err):
		return false, nil
	}
	return false, err
}
