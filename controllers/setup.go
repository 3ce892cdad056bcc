package controllers

import (
	"context"
	"errors"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/oversellnodes"
	"github.com/hookwright/hookwright/internal/webhookprobe"
)

// shared is what the reconcilers of one manager have in common.
type shared struct {
	caDir *caDir // nil without Settings.CADir
	// userSecrets caches the metadata of every Secret (see usersecrets.go);
	// nil when not set up.
	userSecrets cache.Cache
	// upgrade holds OLM upgrades during a CA rotation or a node restore
	// (nil: not set up, does nothing).
	upgrade *upgradeGate
	// prober runs the live check of every CR's webhook (nil: none).
	prober *prober
	// rollouts lets server Deployments roll one at a time (serverrollout.go).
	rollouts serverRollouts
	// status writes the CRs' status, each writer its share.
	status *statusWriter
}

// Setup registers both reconcilers with mgr. The manager's cache must be
// built with CacheOptions so that owned objects are watched by label.
func Setup(mgr ctrl.Manager, s Settings) error {
	if s.Namespace == "" || s.Image == "" {
		return errors.New("controllers: operator namespace and server image are required")
	}
	sh := &shared{status: newStatusWriter(mgr.GetClient(), mgr.GetAPIReader())}
	if s.CADir != "" {
		d, err := newCADir(s.CADir, mgr.GetLogger())
		if err != nil {
			return err
		}
		if err := mgr.Add(d); err != nil {
			return err
		}
		sh.caDir = d
	}
	us, err := newUserSecretCache(mgr, append([]string{s.Namespace}, s.ServerPolicy().Namespaces...))
	if err != nil {
		return err
	}
	if err := mgr.Add(us); err != nil {
		return err
	}
	sh.userSecrets = us
	// The OperatorCondition is one object: read it uncached.
	oc, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return err
	}
	sh.upgrade = newUpgradeGate(oc, s.Namespace, mgr.GetLogger())
	if err := mgr.Add(sh.upgrade); err != nil {
		return err
	}
	policy := s.Probe
	if policy == (webhookprobe.Policy{}) {
		policy = webhookprobe.DefaultPolicy
	}
	sh.prober = newProber(policy)
	if sh.prober.client, err = newProbeClient(mgr); err != nil {
		return err
	}
	if err := mgr.Add(sh.prober); err != nil {
		return err
	}
	ix, err := setupFleet(mgr, s, sh.status)
	if err != nil {
		return err
	}
	nodes := &oversellnodes.Nodes{Pods: ix,
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder("hookwright-" + desired.OversellKind.Short), Now: s.Certificates.Now,
		Settings: s.Settings,
	}
	for _, k := range []kind{sidecarKind{revisions: &revisionKeeper{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: s.Namespace}}, oversellKind{nodes: nodes}} {
		r := newReconciler(mgr, s, k)
		r.shared = sh
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	ca := &sources.CAReconciler{
		Env: sources.Env{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("hookwright-ca"),
			Settings: s.Settings, Certificates: s.Certificates,
			Extra: func() []byte { return sh.caDir.Bundle() },
		},
		// The CSR signer signs with it too, with or without SelfSigned CRs.
		Always: s.Webhook.Service != "" || s.CSR.OwnSigner != "",
		Rotating: func(ctx context.Context, rotating bool, why string) {
			if rotating {
				holdUpgrade(ctx, sh, caRotationHold, why)
			} else {
				releaseUpgrade(ctx, sh, caRotationHold)
			}
		},
	}
	if err := ca.SetupWithManager(mgr); err != nil {
		return err
	}
	if s.Webhook.Service != "" {
		if s.Webhook.Certs != nil {
			s.Webhook.Certs.setReader(mgr.GetClient())
		}
		v := &validationReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Settings: s, shared: sh}
		if err := v.setup(mgr); err != nil {
			return err
		}
	}
	return nil
}

// ownedTypes are watched by every reconciler (Owns: events map to the
// controlling CR through its ownerReference).
func ownedTypes() []client.Object {
	return []client.Object{
		&corev1.ServiceAccount{}, &rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{},
		&appsv1.Deployment{}, &policyv1.PodDisruptionBudget{}, &corev1.Service{}, &corev1.Secret{},
		&admissionregistrationv1.MutatingWebhookConfiguration{},
		// A SidecarInjector's probe namespace (probe.go).
		&corev1.Namespace{},
	}
}

// CacheOptions restrict the manager's cache for the owned types (and
// Secrets) to objects labelled app.kubernetes.io/managed-by=hookwright, so
// the operator does not hold every Deployment, Service or Secret of the
// cluster in memory. Objects it does not label (a user's serving Secret) are
// read with the API reader. With namespaces (the operator's and the allowed
// server namespaces) every namespaced type, cert-manager's included, is
// listed and watched only there: the operator's RBAC for namespaced objects
// is namespaced too (a cluster-wide watch would be forbidden). None: every
// namespace.
func CacheOptions(namespaces ...string) cache.Options {
	sel := labels.SelectorFromSet(labels.Set{desired.LabelManagedBy: desired.ManagedByValue})
	by := map[client.Object]cache.ByObject{}
	for _, o := range ownedTypes() {
		by[o] = cache.ByObject{Label: sel}
	}
	by[&corev1.Node{}] = cache.ByObject{Transform: slimNode}
	by[&admissionregistrationv1.ValidatingWebhookConfiguration{}] = cache.ByObject{Label: sel}
	// SidecarInjector revision history (revisions.go).
	by[&appsv1.ControllerRevision{}] = cache.ByObject{Label: sel}
	// The servers' EndpointSlices carry their Service's labels (the
	// EndpointSlice controller copies them): watched for foreign endpoints.
	by[&discoveryv1.EndpointSlice{}] = cache.ByObject{Label: sel}
	// Server pods, for ServerPodsHealthy (podhealth.go).
	by[&corev1.Pod{}] = serverPodCache()
	// cert-manager's Certificates and Issuers are not listed: a ByObject
	// entry needs their CRDs at start. Their informers start (unfiltered)
	// only when a CertManager-mode CR is reconciled with cert-manager present.
	return cache.Options{ByObject: by, DefaultNamespaces: namespaceConfigs(namespaces)}
}

// namespaceConfigs is a cache's DefaultNamespaces for namespaces (nil: all).
func namespaceConfigs(namespaces []string) map[string]cache.Config {
	if len(namespaces) == 0 {
		return nil
	}
	m := map[string]cache.Config{}
	for _, ns := range namespaces {
		m[ns] = cache.Config{}
	}
	return m
}

// slimNode keeps what the NodeOversell reconciler reads of a node (name,
// labels, annotations, taints, capacity and allocatable) and drops the rest (image
// lists, conditions, managedFields) before it enters the cache.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone or another type: unchanged
	}
	return &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Generation: n.Generation,
			CreationTimestamp: n.CreationTimestamp, DeletionTimestamp: n.DeletionTimestamp,
			Labels: n.Labels, Annotations: n.Annotations,
		},
		// Taints: the NodeOversell reconciler sets and removes its own.
		Spec:   corev1.NodeSpec{Taints: n.Spec.Taints},
		Status: corev1.NodeStatus{Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable},
	}, nil
}

// Upgrade holds: one for the installation CA, one per restoring CR.
const caRotationHold = "ca-rotation"

func restoreHold(name string) string { return "restore/" + name }

// holdUpgrade and releaseUpgrade log a failed OperatorCondition write; the
// gate retries it (upgradeGate.Start) and on the next hold or release.
func holdUpgrade(ctx context.Context, sh *shared, key, why string) {
	if sh == nil {
		return
	}
	if err := sh.upgrade.Hold(ctx, key, why); err != nil {
		log.FromContext(ctx).Error(err, "hold OLM upgrades", "hold", key)
	}
}

func releaseUpgrade(ctx context.Context, sh *shared, key string) {
	if sh == nil {
		return
	}
	if err := sh.upgrade.Release(ctx, key); err != nil {
		log.FromContext(ctx).Error(err, "release OLM upgrades", "hold", key)
	}
}
