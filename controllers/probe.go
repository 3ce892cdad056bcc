package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/webhookprobe"
)

// The live check of each webhook (WebhookReachable): the SidecarInjector
// probe namespace, owned by its CR, and dry-run pod creates in it; the
// NodeOversell probe is a dry-run nodes/status patch (nodes/status patch
// is granted in oversell.go).
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=create

// probeTimeout bounds one probe request (the webhooks' own timeouts are
// at most 30 s, admissionregistration/v1 timeoutSeconds).
const probeTimeout = 35 * time.Second

// probeWorkers probe CRs concurrently: a probe of a broken webhook waits
// for its timeout.
const probeWorkers = 4

// probeOutcome is the result of one probe: ok, or the failing step (a
// WebhookReachable reason) and what was seen.
type probeOutcome struct {
	OK      bool
	Reason  string
	Message string
	// Unknown: nothing could be probed (no target); not a failure of the
	// webhook, not counted in the backoff.
	Unknown bool
}

// probeFunc makes one probe request.
type probeFunc func(ctx context.Context) probeOutcome

// probeEntry is what the prober keeps of one CR.
type probeEntry struct {
	kind, name  string
	fingerprint string
	run         probeFunc
	hist        webhookprobe.History
	// last is the last outcome (nil: none yet), lastSuccess its time when ok.
	last        *probeOutcome
	lastSuccess time.Time
	running     bool
}

// prober runs every CR's probe off the reconcile path (a probe of a
// broken webhook waits for its timeout) at the pace webhookprobe.Policy
// decides, and re-triggers the CR's reconcile when the outcome changes,
// which writes the condition: the lifecycle reconciler stays the only
// writer of status. It runs on the leader only (a manager Runnable).
type prober struct {
	policy webhookprobe.Policy
	now    func() time.Time
	queue  workqueue.TypedDelayingInterface[string]
	// client makes the probe requests (nil: the reconciler's).
	client client.Client

	mu      sync.Mutex
	entries map[string]*probeEntry
	// notify re-reconciles one CR of a kind (by kind name).
	notify map[string]chan event.GenericEvent
	newObj map[string]func() client.Object
}

func newProber(policy webhookprobe.Policy) *prober {
	return &prober{
		policy: policy, now: time.Now,
		queue:   workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: "webhook-probe"}),
		entries: map[string]*probeEntry{}, notify: map[string]chan event.GenericEvent{}, newObj: map[string]func() client.Object{},
	}
}

// channel is the event source that re-reconciles CRs of kind k.
func (p *prober) channel(k kind) <-chan event.GenericEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan event.GenericEvent, 64)
	p.notify[k.Kind().Name] = ch
	p.newObj[k.Kind().Name] = func() client.Object { return k.New() }
	return ch
}

func probeKey(kind, name string) string { return kind + "/" + name }

// Observe records the CR's current probe (run) and fingerprint (what a
// change of configuration or certificate changes) and schedules it.
func (p *prober) Observe(kind, name, fingerprint string, run probeFunc) {
	key := probeKey(kind, name)
	now := p.now()
	p.mu.Lock()
	e := p.entries[key]
	if e == nil {
		e = &probeEntry{kind: kind, name: name}
		p.entries[key] = e
	}
	if e.fingerprint != fingerprint {
		e.fingerprint = fingerprint
		e.hist.LastChange = now
	}
	e.run = run
	wait := p.policy.Wait(e.hist, now)
	p.mu.Unlock()
	p.queue.AddAfter(key, wait)
}

// Result is the last outcome for a CR (nil: none yet) and its last success.
func (p *prober) Result(kind, name string) (*probeOutcome, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[probeKey(kind, name)]
	if e == nil || e.last == nil {
		return nil, time.Time{}
	}
	o := *e.last
	return &o, e.lastSuccess
}

// Forget drops a CR that is gone or no longer probed.
func (p *prober) Forget(kind, name string) {
	p.mu.Lock()
	delete(p.entries, probeKey(kind, name))
	p.mu.Unlock()
}

// Start runs the workers until ctx ends (manager.Runnable).
func (p *prober) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range probeWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p.work(ctx) {
			}
		}()
	}
	<-ctx.Done()
	p.queue.ShutDown()
	wg.Wait()
	return nil
}

// work probes the next due CR; false once the queue is shut down.
func (p *prober) work(ctx context.Context) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(key)
	now := p.now()
	p.mu.Lock()
	e := p.entries[key]
	if e == nil || e.running {
		p.mu.Unlock()
		return true
	}
	if wait := p.policy.Wait(e.hist, now); wait > 0 {
		p.mu.Unlock()
		p.queue.AddAfter(key, wait)
		return true
	}
	e.running = true
	run, kind, name := e.run, e.kind, e.name
	p.mu.Unlock()

	sink := &warningSink{}
	pctx, cancel := context.WithTimeout(context.WithValue(ctx, warningsKey{}, sink), probeTimeout)
	start := time.Now()
	out := run(pctx)
	took := time.Since(start)
	cancel()
	if w := sink.texts(); !out.OK && len(w) > 0 {
		// e.g. the injector's "not injected: no template selected".
		out.Message += "; the API server warned: " + strings.Join(w, "; ")
	}
	if ctx.Err() != nil {
		return true
	}
	recordProbe(kind, name, out, took, now)
	log.FromContext(ctx).V(1).Info("webhook probe", "kind", kind, "name", name, "ok", out.OK, "reason", out.Reason, "took", took)

	p.mu.Lock()
	e.running = false
	if p.entries[key] != e {
		p.mu.Unlock()
		return true
	}
	changed := e.last == nil || e.last.OK != out.OK || e.last.Reason != out.Reason || e.last.Unknown != out.Unknown
	// Nothing to probe backs off as a failure does.
	e.hist = webhookprobe.Record(e.hist, now, out.OK)
	e.last = &out
	if out.OK {
		e.lastSuccess = now
	}
	wait := p.policy.Wait(e.hist, p.now())
	ch, newObj := p.notify[kind], p.newObj[kind]
	p.mu.Unlock()
	p.queue.AddAfter(key, wait)
	if changed && ch != nil {
		obj := newObj()
		obj.SetName(name)
		select {
		case ch <- event.GenericEvent{Object: obj}:
		case <-ctx.Done():
		}
	}
	return true
}

// warningSink collects the warnings (HTTP Warning headers, code 299) of
// one probe's requests; webhooks send theirs through the API server
// (AdmissionResponse.warnings).
type warningSink struct {
	mu sync.Mutex
	w  []string
}

type warningsKey struct{}

func (s *warningSink) texts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.w)
}

// probeWarnings is the probe client's rest.WarningHandlerWithContext.
type probeWarnings struct{}

func (probeWarnings) HandleWarningHeaderWithContext(ctx context.Context, code int, _ string, text string) {
	s, ok := ctx.Value(warningsKey{}).(*warningSink)
	if !ok || code != 299 {
		return
	}
	s.mu.Lock()
	if len(s.w) < 5 {
		s.w = append(s.w, text)
	}
	s.mu.Unlock()
}

// newProbeClient is the manager's client (reads from its cache) with the
// probe's warning handler.
func newProbeClient(mgr ctrl.Manager) (client.Client, error) {
	cfg := rest.CopyConfig(mgr.GetConfig())
	cfg.WarningHandler, cfg.WarningHandlerWithContext = nil, probeWarnings{}
	return client.New(cfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), Cache: &client.CacheOptions{Reader: mgr.GetCache()}})
}

// probing kinds have a live check (sidecar.go, oversell.go).
type probing interface {
	// ProbeObjects are owned objects the probe needs (may be none).
	ProbeObjects(cr v1alpha1.Object, s desired.Settings) ([]client.Object, error)
	// Probe returns the request that proves the webhook of cr (as
	// configured in wh) is called and answers right. It reads cr and wh
	// as they are now; the returned function may run later.
	Probe(c client.Client, cr v1alpha1.Object, wh *admissionregistrationv1.MutatingWebhookConfiguration, s desired.Settings) probeFunc
}

// phaseProbe keeps the CR's probe up to date with what was just
// published and sets WebhookReachable from the last outcome. It writes
// the condition only when its status or reason changes, so a webhook
// that keeps answering (or keeps failing the same way) costs no status
// write: the time of each success is the metric
// hookwright_webhook_probe_last_success_timestamp_seconds.
func (r *reconciler) phaseProbe(ctx context.Context, p *pass) (time.Duration, bool, error) {
	k, ok := r.kind.(probing)
	if !ok || r.shared == nil || r.shared.prober == nil {
		return 0, false, nil
	}
	kindName, name := p.op.Kind.Name, p.op.Object.GetName()
	objs, err := k.ProbeObjects(p.op.Object, r.Settings.Settings)
	if err != nil {
		r.setProbeCondition(p.op, metav1.ConditionUnknown, v1alpha1.WebhookProbeReasonNoTarget, err.Error())
		r.shared.prober.Forget(kindName, name)
		return 0, false, nil
	}
	for _, o := range objs {
		if _, err := r.ensure(ctx, p.op, o); err != nil {
			return 0, false, err
		}
	}
	if !apimeta.IsStatusConditionTrue(p.op.Conditions(), v1alpha1.ConditionWebhookConfigured) {
		r.setProbeCondition(p.op, metav1.ConditionUnknown, v1alpha1.WebhookProbeReasonNotConfigured,
			"the webhook configuration is not written yet: nothing to probe")
		return 0, false, nil
	}
	wh := p.d.Webhook.DeepCopy()
	c := r.shared.prober.client
	if c == nil {
		c = r.Client
	}
	r.shared.prober.Observe(kindName, name, probeFingerprint(p, wh), k.Probe(c, p.op.Object.DeepCopyObject().(v1alpha1.Object), wh, r.Settings.Settings))
	out, last := r.shared.prober.Result(kindName, name)
	switch {
	case out == nil:
		if apimeta.FindStatusCondition(p.op.Conditions(), v1alpha1.ConditionWebhookReachable) == nil {
			r.setProbeCondition(p.op, metav1.ConditionUnknown, v1alpha1.WebhookProbeReasonPending, "first probe pending")
		}
	case out.OK:
		r.setProbeCondition(p.op, metav1.ConditionTrue, v1alpha1.WebhookProbeReasonReachable, out.Message)
	case out.Unknown:
		r.setProbeCondition(p.op, metav1.ConditionUnknown, out.Reason, out.Message)
	default:
		msg := out.Message + "; last success: never"
		if !last.IsZero() {
			msg = out.Message + "; last success: " + last.UTC().Format(time.RFC3339)
		}
		r.setProbeCondition(p.op, metav1.ConditionFalse, out.Reason, msg)
	}
	return 0, false, nil
}

// setProbeCondition sets WebhookReachable unless it already has this
// status and reason for the CR's generation.
func (r *reconciler) setProbeCondition(op desired.CR, st metav1.ConditionStatus, reason, msg string) {
	if c := apimeta.FindStatusCondition(op.Conditions(), v1alpha1.ConditionWebhookReachable); c != nil &&
		c.Status == st && c.Reason == reason && c.ObservedGeneration == op.Object.GetGeneration() {
		return
	}
	apimeta.SetStatusCondition(op.Object.StatusConditions(), metav1.Condition{
		Type: v1alpha1.ConditionWebhookReachable, Status: st, Reason: reason, Message: msg, ObservedGeneration: op.Object.GetGeneration(),
	})
}

// probeFingerprint changes with everything a probe's outcome may depend
// on: the CR's spec (generation), the webhook configuration as published
// (caBundle, service, selectors), the serving certificate and the server's
// available replicas (ServerAvailable's message), so a server that just
// became available is probed soon, not at the failing backoff's pace.
func probeFingerprint(p *pass, wh *admissionregistrationv1.MutatingWebhookConfiguration) string {
	h := sha256.New()
	avail := ""
	if c := apimeta.FindStatusCondition(p.op.Conditions(), v1alpha1.ConditionServerAvailable); c != nil {
		avail = string(c.Status) + c.Message
	}
	fmt.Fprintf(h, "%d\x00%s\x00%s\x00", p.op.Object.GetGeneration(), p.cert.NotAfter.UTC().Format(time.RFC3339Nano), avail)
	for _, w := range wh.Webhooks {
		fmt.Fprintf(h, "%s\x00%x\x00%v\x00%v\x00%v\x00", w.Name, w.ClientConfig.CABundle, w.ClientConfig.Service, w.NamespaceSelector, w.ObjectSelector)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// probeOK and probeFailed are outcomes; probeError classifies a refused
// probe request.
func probeOK(format string, a ...any) probeOutcome {
	return probeOutcome{OK: true, Reason: v1alpha1.WebhookProbeReasonReachable, Message: fmt.Sprintf(format, a...)}
}

func probeFailed(reason, format string, a ...any) probeOutcome {
	return probeOutcome{Reason: reason, Message: fmt.Sprintf(format, a...)}
}

func probeError(webhook, what string, err error) probeOutcome {
	return probeFailed(webhookprobe.Classify(webhook, err.Error()), "%s: %v", what, err)
}
