// Package app is the operator's composition root, beside cmd/ as
// cert-manager keeps its cmd/controller/app: it builds the operator's
// controller-runtime manager: the scheme, the cache, the validating webhook
// server (cmd/app/validation) and its certificate, the controllers, and the
// health and readiness checks. `hookwright manager` (cmd/manager.go) and the
// operator tests (test/operator) build it with the same New, so the two
// cannot drift apart.
//
// It may import controllers/ and the webhooks; nothing but cmd/ and tests
// imports it.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/cmd/app/validation"
	"github.com/hookwright/hookwright/controllers"
	"github.com/hookwright/hookwright/controllers/csrsigner"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/oversellnodes"
	"github.com/hookwright/hookwright/internal/serverpolicy"
	"github.com/hookwright/hookwright/webhooks/listener"
)

// LeaderElectionID is the Lease the manager replicas elect a leader on
// (in their namespace; hookwright check reads it).
const LeaderElectionID = "hookwright.admission.hookwright.io"

// NewScheme registers client-go's kinds, hookwright's, and the third-party
// kinds the controllers read and write (controllers.AddToScheme).
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, controllers.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Options are the manager's inputs; cmd/manager.go fills them from its flags.
type Options struct {
	// Metrics is the metrics server (BindAddress "0" disables it).
	Metrics metricsserver.Options
	// ProbeAddr is the address of /healthz and /readyz ("0" disables them).
	ProbeAddr string
	// PprofAddr is the address of /debug/pprof ("0" or empty disables it).
	PprofAddr string
	// LeaderElection elects a leader on LeaderElectionID in
	// LeaderElectionNamespace (empty: Settings.Namespace).
	LeaderElection          bool
	LeaderElectionNamespace string
	// WebhookHost and WebhookPort are where the validating webhook server
	// listens (Host empty: every interface).
	WebhookHost string
	WebhookPort int
	// WebhookDrainPeriod is the validating webhook server's drain after
	// the context ends (listener.Options.DrainPeriod); 0 means none (tests
	// and out-of-cluster runs, where no Service routes to this process).
	WebhookDrainPeriod time.Duration
	// WebhookService, when set, is the Service in Settings.Namespace in front
	// of the webhook server: the manager then serves the validating webhook
	// and manages its configuration and certificate. Empty serves none.
	WebhookService string
	// Servers is the server policy of the flags (serverpolicy.New).
	Servers serverpolicy.Policy
	// Settings of the controllers; Webhook is filled from WebhookService.
	Settings controllers.Settings
	// Signer, when set, makes the operator the CSR signer of
	// Signer.SignerName (csrsigner.Setup; CASecret and Namespaces are filled
	// from Settings) and mode CSR's own signer.
	Signer *csrsigner.Options
	// WrapValidation, when set, wraps the validating webhook's handler
	// (tests stand in for a webhook that was down).
	WrapValidation func(admission.Handler) admission.Handler
	// LeaseOwner, when set (LeaseOwnerFromEnv), becomes the owner of the
	// leader election Lease while this replica leads.
	LeaseOwner *metav1.OwnerReference
	// OperatorDeployment is the Deployment running this operator in
	// Settings.Namespace: once it is deleted or scaled to zero (seen by a
	// watch while the manager runs, checked again as it exits), every
	// webhook configuration the operator manages is switched to Ignore
	// (uninstall.go). Empty: off.
	OperatorDeployment string
	// SkipNameValidation lets a process build a second manager after the
	// first stopped (the operator tests restart theirs): controller-runtime
	// refuses a controller name it saw before in the process otherwise.
	SkipNameValidation bool
}

// Run starts mgr and, once it stopped, deletes the leader election Lease
// this replica released (see deleteReleasedLease).
func Run(ctx context.Context, cfg *rest.Config, mgr ctrl.Manager, o Options) error {
	err := mgr.Start(ctx)
	failOpenIfGone(cfg, o.Settings.Namespace, o.OperatorDeployment)
	if o.LeaderElection {
		leNS := o.LeaderElectionNamespace
		if leNS == "" {
			leNS = o.Settings.Namespace
		}
		deleteReleasedLease(cfg, leNS, LeaderElectionID)
	}
	return err
}

// New builds the manager with every controller set up; the caller starts it.
func New(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	s := o.Settings
	leNS := o.LeaderElectionNamespace
	if leNS == "" {
		leNS = s.Namespace
	}
	webhookCerts := controllers.NewServingCertSource(s.Namespace)
	// The HTTP envelope of the webhook servers (timeouts on every phase of a
	// request, a connection limit), HTTP/1.1 only as on the metrics port:
	// HTTP/2 stream floods (CVE-2023-44487) cost nothing for an admission
	// client. TLS 1.2 stays the minimum, as with controller-runtime's server.
	// No close wait (listener.Options.CloseWait): controller-runtime
	// releases the leader Lease only once the webhook server stopped, and
	// this webhook sees only the rare CR writes.
	so := listener.Options{Host: o.WebhookHost, Port: o.WebhookPort, MinTLSVersion: "1.2", MaxConnections: 1000, DrainPeriod: o.WebhookDrainPeriod}
	webhookServer, err := so.NewServerWithTLS(func(c *tls.Config) { c.GetCertificate = webhookCerts.GetCertificate })
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		WebhookServer:           webhookServer,
		Scheme:                  scheme,
		Metrics:                 o.Metrics,
		HealthProbeBindAddress:  o.ProbeAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: leNS,
		// Step down on shutdown (the process exits right after Start
		// returns), so the Lease can be deleted: see Run.
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controllers.CacheOptions(append([]string{s.Namespace}, o.Servers.Namespaces...)...),
		Controller:                    config.Controller{SkipNameValidation: &o.SkipNameValidation},
		// The webhook server drains and finishes in-flight reviews after
		// the controllers and caches stopped; leave it the time.
		GracefulShutdownTimeout: ptr.To(so.ShutdownBound() + 10*time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if o.WebhookService != "" {
		s.Webhook = controllers.WebhookSettings{Service: o.WebhookService, Path: validation.Path, Certs: webhookCerts}
		// A NodeOversell update's warning names the nodes it would hold.
		preview := &oversellnodes.Nodes{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}
		var h admission.Handler = validation.Handler{Servers: &o.Servers, Holds: preview.PreviewHolds}
		if o.WrapValidation != nil {
			h = o.WrapValidation(h)
		}
		mgr.GetWebhookServer().Register(validation.Path, &webhook.Admission{Handler: h})
	}
	if o.LeaderElection && o.LeaseOwner != nil {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		pod := *o.LeaseOwner
		// A Runnable without NeedLeaderElection runs only on the leader.
		if err := mgr.Add(crmanager.RunnableFunc(func(ctx context.Context) error {
			ownLease(ctx, cs, leNS, LeaderElectionID, pod)
			return nil
		})); err != nil {
			return nil, err
		}
	}
	if o.OperatorDeployment != "" {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		uw := &uninstallWatch{cs: cs, namespace: s.Namespace, deployment: o.OperatorDeployment}
		if err := mgr.Add(uw); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("uninstall-watch", uw.Ready); err != nil {
			return nil, err
		}
	}
	if o.Signer != nil {
		so := *o.Signer
		so.CASecret = types.NamespacedName{Namespace: s.Namespace, Name: desired.CASecretName}
		so.Namespaces = o.Servers.Namespaces
		if so.SignerName == "" {
			so.SignerName = v1alpha1.DefaultCSRSignerName
		}
		trust, err := csrsigner.Setup(mgr, so)
		if err != nil {
			return nil, fmt.Errorf("set up the CSR signer: %w", err)
		}
		s.CSR.Trust, s.CSR.OwnSigner = trust, so.SignerName
	}
	if err := controllers.Setup(mgr, s); err != nil {
		return nil, fmt.Errorf("set up controllers: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	// Ready means able to answer: the validating webhook is listening (a
	// replica behind the webhook Service before that refuses admissions)
	// and the informer caches have synced (non-leaders start theirs too).
	if o.WebhookService != "" {
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddReadyzCheck("caches", cachesSynced(mgr.GetCache())); err != nil {
		return nil, err
	}
	return mgr, nil
}

// cachesSynced is a readiness check that fails until every informer the
// cache has started has synced; it waits at most a second per probe.
func cachesSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches not synced")
		}
		return nil
	}
}
