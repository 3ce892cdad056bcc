package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/failopen"
)

// failOpenPeriod is how often an injector server looks at the operator's
// Deployment, with up to 20% jitter so the replicas of many injectors do
// not ask at once. One GET per period per replica.
const failOpenPeriod = 10 * time.Second

// failOpenWatch switches an injector's own MutatingWebhookConfiguration
// and the manager's ValidatingWebhookConfiguration to failurePolicy Ignore
// once the operator is gone (failopen.OperatorGone on its Deployment).
// The servers outlive the operator: their Deployments are owned by the
// CRs, while Helm, OLM and `kubectl delete -k` delete the operator's RBAC
// with its Deployment, before its own exit-time step can act. It acts only
// while the operator is gone, so it never fights an operator that re-arms
// Fail after its probe (health.DecideFailurePolicy), and it writes only
// webhooks still not Ignore, once per time the operator goes.
type failOpenWatch struct {
	reader   client.Reader // uncached: one GET per period, no informer
	writer   client.Writer
	operator types.NamespacedName
	// configs: the injector's own configuration (mutating) and the
	// manager's (validating).
	mutating, validating string
	switched             *prometheus.CounterVec
	log                  logr.Logger

	// check runs on one goroutine (wait.JitterUntil), so these need no lock.
	// done: configurations switched (or found all Ignore or absent) since
	// the operator went; cleared when it is back.
	done map[string]bool
	// warned: calls already logged as refused (Forbidden), so a missing
	// permission is logged once, not every period.
	warned map[string]bool
}

// parseOperatorDeployment parses --operator-deployment, "<namespace>/<name>".
func parseOperatorDeployment(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("--operator-deployment %q: want <namespace>/<name>", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// newFailedOpenCounter registers hookwright_server_failed_open_total.
func newFailedOpenCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hookwright_server_failed_open_total",
		Help: "Webhook configurations this server switched to failurePolicy Ignore because the operator's Deployment was gone, deleted or scaled to zero, by configuration name.",
	}, []string{"configuration"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	return c, nil
}

// NeedLeaderElection is false: the server runs no leader election, and
// every replica checks (a second switch finds nothing left on Fail).
func (w *failOpenWatch) NeedLeaderElection() bool { return false }

// Start checks every failOpenPeriod (jittered) until ctx ends.
func (w *failOpenWatch) Start(ctx context.Context) error {
	wait.JitterUntilWithContext(ctx, w.check, failOpenPeriod, 0.2, true)
	return nil
}

// check runs one period: read the operator's Deployment, and when the
// operator is gone switch what is still not Ignore.
func (w *failOpenWatch) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, failOpenPeriod)
	defer cancel()
	dep := &appsv1.Deployment{}
	err := w.reader.Get(ctx, w.operator, dep)
	found := err == nil
	if apierrors.IsNotFound(err) {
		err = nil
	}
	if err != nil {
		// Not knowing is not gone: a server without the permission (an
		// older operator's ClusterRole) or an API outage changes nothing.
		w.refused("get the operator Deployment", err)
		return
	}
	w.allowed("get the operator Deployment")
	if !failopen.OperatorGone(dep, found) {
		clear(w.done)
		return
	}
	w.switchMutating(ctx)
	w.switchValidating(ctx)
}

func (w *failOpenWatch) switchMutating(ctx context.Context) {
	if w.done["mutating"] {
		return
	}
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := w.reader.Get(ctx, client.ObjectKey{Name: w.mutating}, m); err != nil {
		w.got("mutating", w.mutating, err)
		return
	}
	patch, names := failopen.MutatingPatch(m)
	w.patch(ctx, "mutating", m, patch, names)
}

func (w *failOpenWatch) switchValidating(ctx context.Context) {
	if w.validating == "" || w.done["validating"] {
		return
	}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := w.reader.Get(ctx, client.ObjectKey{Name: w.validating}, v); err != nil {
		w.got("validating", w.validating, err)
		return
	}
	patch, names := failopen.ValidatingPatch(v)
	w.patch(ctx, "validating", v, patch, names)
}

// got handles a failed GET of a configuration: absent is done (nothing
// to switch), anything else is tried again next period.
func (w *failOpenWatch) got(kind, name string, err error) {
	if apierrors.IsNotFound(err) {
		w.done[kind] = true
		return
	}
	w.refused("get "+kind+" webhook configuration "+name, err)
}

func (w *failOpenWatch) patch(ctx context.Context, kind string, obj client.Object, patch []byte, names []string) {
	if patch == nil {
		w.done[kind] = true
		return
	}
	what := "patch " + kind + " webhook configuration " + obj.GetName()
	if err := w.writer.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) {
			w.done[kind] = true
			return
		}
		w.refused(what, err)
		return
	}
	w.allowed(what)
	w.done[kind] = true
	w.switched.WithLabelValues(obj.GetName()).Inc()
	w.log.Info("operator gone: switched webhooks to failurePolicy Ignore", "operatorDeployment", w.operator.String(),
		"configuration", obj.GetName(), "webhooks", names)
}

// refused logs a failed call; a Forbidden once until the call succeeds.
func (w *failOpenWatch) refused(what string, err error) {
	if apierrors.IsForbidden(err) {
		if w.warned[what] {
			return
		}
		w.warned[what] = true
		w.log.Error(err, "cannot fail open when the operator goes: permission missing (logged once)", "call", what)
		return
	}
	w.log.Error(err, "fail-open check", "call", what)
}

func (w *failOpenWatch) allowed(what string) {
	delete(w.warned, what)
}

// newFailOpenWatch is the watch of injector server for configuration
// mutating, or nil when operator is "" (off).
func newFailOpenWatch(c client.Client, reader client.Reader, operator, mutating string, reg prometheus.Registerer, log logr.Logger) (*failOpenWatch, error) {
	if operator == "" {
		return nil, nil
	}
	op, err := parseOperatorDeployment(operator)
	if err != nil {
		return nil, err
	}
	counter, err := newFailedOpenCounter(reg)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return &failOpenWatch{
		reader: reader, writer: c, operator: op,
		mutating: mutating, validating: desired.ValidatingConfigName,
		switched: counter, log: log.WithName("failopen"),
		done: map[string]bool{}, warned: map[string]bool{},
	}, nil
}
