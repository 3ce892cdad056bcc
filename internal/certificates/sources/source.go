// Package sources holds the certificate lifecycle of the operator's
// webhook servers: one Source per spec.certificate.mode, each gathering its
// inputs from the API, deciding in a pure function and acting on what it
// owns; the installation CA controller (CAReconciler), keyed on the CA
// Secret, that creates and rotates the CA SelfSigned mode signs with; and
// ConfigBundle, the one place that decides the caBundle of every webhook
// configuration.
//
// It is the I/O of internal/certificates: it may import internal/desired,
// internal/apply and the pure internal/certificates/pki and csrplan, but
// not the reconcilers in controllers/: they call it, never the reverse.
package sources

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
)

// Source is one certificate mode: it gives a CR's server its serving
// certificate and says which CAs its webhook configuration must trust.
//
// To add a mode, write one file with a type implementing Source: gather
// the mode's inputs from Env (cache, API reader), decide in a pure function
// (a table test beside it), act through apply (the reconciler's
// server-side apply with drift repair, owned by cr) and Env.Recorder, and
// list what the mode owns in State.Keep. Then add it to New.
type Source interface {
	// Certificate brings cr's serving certificate to its desired state and
	// returns it. An error is the API's or a failure to generate a key;
	// State.Reason and Message, when set, still describe it.
	Certificate(ctx context.Context, cr desired.CR, apply Apply) (State, error)
}

// Apply server-side applies obj as an object owned by the CR being
// reconciled (repair budget, Events; see controllers' ensure).
type Apply func(ctx context.Context, obj client.Object) error

// Sources is the Source of each certificate mode.
type Sources map[v1alpha1.CertificateMode]Source

// New returns the source of every mode, sharing env.
func New(env Env) Sources {
	return Sources{
		v1alpha1.CertificateSelfSigned:  &selfSigned{env},
		v1alpha1.CertificateSecret:      &userSecret{env},
		v1alpha1.CertificateCertManager: &certManager{env},
		v1alpha1.CertificateCSR:         &csrSource{env},
	}
}

// For returns the source of cr's mode (desired.CertificateMode), or nil
// for a mode no source handles.
func (s Sources) For(cr desired.CR) Source { return s[desired.CertificateMode(cr)] }

// Env is what every source may use.
type Env struct {
	// Client reads from the manager's cache (objects labelled
	// managed-by=hookwright, the CRs).
	Client client.Client
	// APIReader reads uncached (the CA Secret, a user's Secret).
	APIReader client.Reader
	Recorder  events.EventRecorder
	Settings  desired.Settings
	// Certificates tunes SelfSigned mode.
	Certificates Settings
	// Extra returns the CAs (PEM) published besides the operator's own in
	// every SelfSigned configuration (--ca-dir); nil means none.
	Extra func() []byte
	// WatchCertManager, when set, starts the watch on owned cert-manager
	// Certificates once their CRD is served.
	WatchCertManager func() error
	// CSR configures mode CSR.
	CSR CSRSettings
}

func (e Env) extra() []byte {
	if e.Extra == nil {
		return nil
	}
	return e.Extra()
}

// Settings tune SelfSigned mode.
type Settings struct {
	// Policy sets CA and serving lifetimes, rotation points and the delay
	// before a published next CA signs; zero fields take internal/certificates/pki
	// defaults (CA 5 years, rotated at 2/3; serving 90 days, renewed at 2/3;
	// promote 10 s after publishing).
	Policy pki.Policy
	// Clock is the time of certificate decisions; nil is the system clock.
	Clock pki.Clock
	// DrainGrace is how long a replaced serving certificate keeps its CA in
	// the caBundle (pods reload the mounted Secret with a delay); 0 means
	// defaultDrainGrace.
	DrainGrace time.Duration
}

// defaultDrainGrace covers the kubelet's update of a mounted Secret (its
// sync period plus cache TTL, about 1–2 min) and certwatcher's reload.
const defaultDrainGrace = 5 * time.Minute

// Grace is DrainGrace with its default.
func (c Settings) Grace() time.Duration {
	if c.DrainGrace <= 0 {
		return defaultDrainGrace
	}
	return c.DrainGrace
}

// Now is the time of certificate decisions.
func (c Settings) Now() time.Time {
	if c.Clock != nil {
		return c.Clock.Now()
	}
	return time.Now()
}

// Condition reasons of CertificateReady.
const (
	ReasonIssued        = "Issued"
	ReasonValid         = "Valid"
	ReasonCAUnusable    = "CAUnusable"
	reasonSecretInvalid = "SecretInvalid"
	ReasonSecretMissing = "SecretMissing"
	reasonNoCertificate = "NoCertificate"
)

// PublishRule says how a configuration's caBundle follows State.CABundle
// (Publish).
type PublishRule int

const (
	// publishAsIs writes CABundle byte for byte: its source already keeps
	// every CA a served certificate may chain to (SelfSigned's planner).
	publishAsIs PublishRule = iota
	// publishWithOverlap keeps the CAs the configuration carried before
	// CABundle changed for the drain grace (OverlapCABundle).
	publishWithOverlap
	// publishUnlessInjected is publishWithOverlap, except that a
	// configuration cert-manager's cainjector fills keeps its caBundle
	// (InjectedCABundle).
	publishUnlessInjected
)

// State is the certificate side of one CR's desired state.
type State struct {
	// CABundle is the PEM trust bundle for the webhook configuration; nil
	// when no usable certificate exists (the configuration is then not
	// written, so the API server is never pointed at an unverifiable server).
	CABundle []byte
	// BundleOnly: CABundle is set though no serving certificate is issued
	// yet, because the planner issues it only once every existing
	// configuration carries CABundle. An existing configuration is
	// updated; a missing one is still not created.
	BundleOnly bool
	// Publish is how the configuration's caBundle follows CABundle.
	Publish PublishRule
	// Keep are the objects the source owns for the CR (not pruned).
	Keep []client.Object
	// NotAfter and RenewAt of the serving certificate (zero when unknown).
	NotAfter, RenewAt time.Time
	// Ready, Reason and Message fill the CertificateReady condition.
	Ready           bool
	Reason, Message string
	// RequeueAfter is when the source wants to look again (0: on events).
	RequeueAfter time.Duration
}

// Event reasons of the sources.
const (
	EventCertificateIssued = "CertificateIssued"
	// EventCARotation reports a CA step: CreateCA, CreateNextCA,
	// PublishBundle (during a rotation), PromoteNextCA, DropRetiredCA.
	EventCARotation = "CARotation"
	// EventCertManagerNotInstalled: mode CertManager without cert-manager.
	EventCertManagerNotInstalled = "CertManagerNotInstalled"
)

// getOrNil reads key into obj; found is false when it does not exist.
func getOrNil(ctx context.Context, r client.Reader, key client.ObjectKey, obj client.Object) (bool, error) {
	if err := r.Get(ctx, key, obj); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return true, nil
}

func secretOrNil(ctx context.Context, r client.Reader, key client.ObjectKey) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	found, err := getOrNil(ctx, r, key, sec)
	if !found {
		return nil, err
	}
	return sec, nil
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
