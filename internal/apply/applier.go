package apply

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// Event reasons of owned objects.
const (
	EventCreated       = "Created"
	eventUpdated       = "Updated"
	EventDriftRepaired = "DriftRepaired"
	eventDeleted       = "Deleted"
)

// Owner is the custom resource that controls the objects an Applier writes.
type Owner struct {
	// Object is the CR; every owned object has it as controller.
	Object client.Object
	// Kind is its API kind ("SidecarInjector"), for keys, Events and metrics.
	Kind string
}

// Budget bounds how often one owned object is repaired: at most Max
// repairs in any Window. Past that, another writer is fighting the operator
// (a GitOps tool or an injector rewriting caBundle): the operator stops,
// reports the writers from managedFields in a Warning Event and the Ready
// (and WebhookConfigured) condition, and tries again when the window allows.
type Budget struct {
	Max    int
	Window time.Duration
}

// defaultBudget allows 5 repairs of one object per minute.
var defaultBudget = Budget{Max: 5, Window: time.Minute}

// Applier writes owned objects with server-side apply only when the live
// object (from the cache) lacks a field the desired one sets, and tells a
// repair of drift from a change of the desired state and from a cache that
// lags behind its own last write. Safe for concurrent use.
type Applier struct {
	// Client reads the cache and writes.
	Client client.Client
	// APIReader, when set, confirms uncached that an object the last write
	// created and the cache lacks is really gone.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	// Budget limits repairs; zero fields take defaultBudget.
	Budget Budget
	// Now is the clock of the repair budget; nil means time.Now.
	Now func() time.Time
	// OnRepair and OnConflict, when set, count a repair and a repair
	// refused by the budget, by owner kind and object kind (metrics).
	OnRepair, OnConflict func(ownerKind, objectKind string)

	mu      sync.Mutex
	repairs map[string][]time.Time // recent repair times by owner and object
	// applied is the hash of what was last applied per owner and object: a
	// write of something else is the operator's own change (a CA rotation
	// step, a ca-dir update, a spec edit), not a repair of drift.
	applied map[string][sha256.Size]byte
	// wrote is the resourceVersion change of the last write per owner and
	// object: a cached object still at the "from" version is the cache
	// lagging behind that write, not new drift, and must neither be
	// written again nor spend the repair budget.
	wrote map[string]rvChange
}

// rvChange is the resourceVersion before and after one write.
type rvChange struct{ from, to string }

func (a *Applier) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *Applier) count(f func(string, string), ownerKind, objectKind string) {
	if f != nil {
		f(ownerKind, objectKind)
	}
}

// ForgetObject drops what a remembers about one owned object (its
// webhooks removed, or deleted because it is no longer desired): its next
// write is a change of the desired state, not drift.
func (a *Applier) ForgetObject(owner Owner, kind string, obj client.Object) {
	a.forgetKey(key(owner, kind, obj))
}

func ptrUID(u types.UID) *types.UID { return &u }

func summarize(paths []string, n int) string {
	if len(paths) <= n {
		return strings.Join(paths, ", ")
	}
	return strings.Join(paths[:n], ", ") + fmt.Sprintf(" and %d more", len(paths)-n)
}

// ConflictError means an owned object drifted again after Max repairs within
// Window: another writer is changing it. Writers lists the other field
// managers from its managedFields, most recent first.
type ConflictError struct {
	Object     string
	Writers    []string
	Repairs    int
	Window     time.Duration
	RetryAfter time.Duration
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s was changed again after %d repairs within %s, by %s; not repairing it for %s",
		e.Object, e.Repairs, e.Window, strings.Join(e.Writers, ", "), e.RetryAfter.Round(time.Second))
}

func (a *Applier) budget() Budget {
	b := a.Budget
	if b.Max <= 0 {
		b.Max = defaultBudget.Max
	}
	if b.Window <= 0 {
		b.Window = defaultBudget.Window
	}
	return b
}

// checkBudget returns how long to wait before key may be repaired again
// (0: now), dropping repairs older than the window.
func (a *Applier) checkBudget(key string, now time.Time) time.Duration {
	b := a.budget()
	a.mu.Lock()
	defer a.mu.Unlock()
	ts := slices.DeleteFunc(a.repairs[key], func(t time.Time) bool { return now.Sub(t) >= b.Window })
	if len(ts) == 0 {
		delete(a.repairs, key)
	} else {
		a.repairs[key] = ts
	}
	if len(ts) < b.Max {
		return 0
	}
	return max(ts[0].Add(b.Window).Sub(now), time.Second)
}

func (a *Applier) recordRepair(key string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.repairs == nil {
		a.repairs = map[string][]time.Time{}
	}
	a.repairs[key] = append(a.repairs[key], now)
}

// otherWriters names the field managers of obj other than the operator,
// most recent first, e.g. "argocd-controller (Update at 2026-11-29T20:50:01Z)".
func otherWriters(obj client.Object) []string {
	mf := slices.Clone(obj.GetManagedFields())
	slices.SortStableFunc(mf, func(a, b metav1.ManagedFieldsEntry) int {
		var at, bt time.Time
		if a.Time != nil {
			at = a.Time.Time
		}
		if b.Time != nil {
			bt = b.Time.Time
		}
		return bt.Compare(at)
	})
	var out []string
	for _, m := range mf {
		if m.Manager == FieldManager || m.Subresource != "" {
			continue
		}
		w := fmt.Sprintf("%s (%s", m.Manager, m.Operation)
		if m.Time != nil {
			w += " at " + m.Time.UTC().Format(time.RFC3339)
		}
		out = append(out, w+")")
	}
	if len(out) == 0 {
		return []string{"an unknown writer"}
	}
	return out
}

// Ensure server-side applies obj unless the live object (from the cache)
// already holds every field obj sets. It reports whether it wrote.
func (a *Applier) Ensure(ctx context.Context, owner Owner, obj client.Object) (bool, error) {
	gvk, err := apiutil.GVKForObject(obj, a.Scheme)
	if err != nil {
		return false, err
	}
	want, err := ToApplyObject(obj, gvk)
	if err != nil {
		return false, err
	}
	liveObj, err := a.Scheme.New(gvk)
	if err != nil {
		return false, err
	}
	live := liveObj.(client.Object)
	created := false
	var drift []string
	switch err := a.Client.Get(ctx, client.ObjectKeyFromObject(obj), live); {
	case apierrors.IsNotFound(err):
		created = true
	case err != nil:
		return false, err
	default:
		if !metav1.IsControlledBy(live, owner.Object) && metav1.GetControllerOf(live) != nil {
			return false, fmt.Errorf("%s %s is controlled by %s %s, not by %s %s",
				gvk.Kind, client.ObjectKeyFromObject(obj), metav1.GetControllerOf(live).Kind, metav1.GetControllerOf(live).Name,
				owner.Kind, owner.Object.GetName())
		}
		liveMap, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
		if err != nil {
			return false, err
		}
		if drift = Drift(want.Object, liveMap); len(drift) == 0 {
			return false, nil
		}
	}
	budgetKey := key(owner, gvk.Kind, obj)
	wantJSON, err := json.Marshal(want.Object)
	if err != nil {
		return false, err
	}
	wantHash := sha256.Sum256(wantJSON)
	a.mu.Lock()
	w, wroteBefore := a.wrote[budgetKey]
	last, known := a.applied[budgetKey]
	a.mu.Unlock()
	if wroteBefore {
		switch skip, err := a.behindOrUnchanged(ctx, obj, live, created, w, known && last == wantHash); {
		case err != nil:
			return false, err
		case skip != "":
			log.FromContext(ctx).V(1).Info(skip, "object", gvk.Kind+" "+client.ObjectKeyFromObject(obj).String())
			return false, nil
		}
	}
	if created {
		if err := a.ownerLive(ctx, owner); err != nil {
			return false, err
		}
	}
	fromRV := live.GetResourceVersion()
	now := a.now()
	// Unknown (first write since start) or different from the last apply:
	// the desired state moved, which the repair budget does not limit.
	updated := !created && (!known || last != wantHash)
	if !created && !updated {
		if wait := a.checkBudget(budgetKey, now); wait > 0 {
			a.count(a.OnConflict, owner.Kind, gvk.Kind)
			b := a.budget()
			return false, &ConflictError{
				Object:  gvk.Kind + " " + strings.TrimPrefix(client.ObjectKeyFromObject(obj).String(), "/"),
				Writers: otherWriters(live), Repairs: b.Max, Window: b.Window, RetryAfter: wait,
			}
		}
	}
	if err := a.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return false, fmt.Errorf("apply %s %s: %w", gvk.Kind, client.ObjectKeyFromObject(obj), err)
	}
	a.mu.Lock()
	if a.applied == nil {
		a.applied = map[string][sha256.Size]byte{}
	}
	a.applied[budgetKey] = wantHash
	if a.wrote == nil {
		a.wrote = map[string]rvChange{}
	}
	a.wrote[budgetKey] = rvChange{from: fromRV, to: want.GetResourceVersion()}
	a.mu.Unlock()
	name := gvk.Kind + " " + strings.TrimPrefix(client.ObjectKeyFromObject(obj).String(), "/")
	switch {
	case created:
		log.FromContext(ctx).Info("created", "object", name)
		// The owned object is the related object: the events API merges
		// events that differ only in their note into one series.
		a.Recorder.Eventf(owner.Object, obj, corev1.EventTypeNormal, EventCreated, "Create", "created %s", name)
	case updated:
		log.FromContext(ctx).Info("updated", "object", name, "fields", drift)
		a.Recorder.Eventf(owner.Object, obj, corev1.EventTypeNormal, eventUpdated, "Update", "updated %s: %s", name, summarize(drift, 5))
	default:
		a.recordRepair(budgetKey, now)
		a.count(a.OnRepair, owner.Kind, gvk.Kind)
		log.FromContext(ctx).Info("drift repaired", "object", name, "fields", drift)
		a.Recorder.Eventf(owner.Object, obj, corev1.EventTypeNormal, EventDriftRepaired, "Repair", "repaired %s: %s", name, summarize(drift, 5))
	}
	return true, nil
}

// OwnerGoneError is Ensure refusing to create an object for an owner the
// API server no longer has (or is deleting). A reconcile that read its CR
// before the delete would otherwise create children nobody collects: when
// the CR's CRD is deleted with it, the garbage collector cannot resolve the
// owner's kind and leaves them (kube-controller-manager's garbage collector,
// attemptToDeleteItem).
type OwnerGoneError struct {
	Kind, Name string
	// Reason is "not found", "replaced" (another UID) or "being deleted".
	Reason string
}

func (e *OwnerGoneError) Error() string {
	return fmt.Sprintf("%s %s is %s; not creating its objects", e.Kind, e.Name, e.Reason)
}

// ownerLive confirms with one uncached GET that owner still exists with the
// same UID and is not being deleted. Only creates pay for it: they are rare,
// and an update of an existing child is collected with it anyway.
func (a *Applier) ownerLive(ctx context.Context, owner Owner) error {
	if a.APIReader == nil {
		return nil
	}
	probe, ok := owner.Object.DeepCopyObject().(client.Object)
	if !ok {
		return nil
	}
	err := a.APIReader.Get(ctx, client.ObjectKeyFromObject(owner.Object), probe)
	gone := &OwnerGoneError{Kind: owner.Kind, Name: owner.Object.GetName()}
	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		gone.Reason = "not found"
	case err != nil:
		return fmt.Errorf("confirm %s %s exists: %w", owner.Kind, owner.Object.GetName(), err)
	case probe.GetUID() != owner.Object.GetUID():
		gone.Reason = "replaced"
	case !probe.GetDeletionTimestamp().IsZero():
		gone.Reason = "being deleted"
	default:
		return nil
	}
	return gone
}

// ownedKey identifies one owned object of one CR in the repairs, applied
// and wrote maps: "<CR kind>/<CR name>|<kind>/<namespace>/<name>".
func key(owner Owner, kind string, obj client.Object) string {
	return prefix(owner.Kind, owner.Object.GetName()) + kind + "/" + client.ObjectKeyFromObject(obj).String()
}

func prefix(ownerKind, ownerName string) string { return ownerKind + "/" + ownerName + "|" }

// behindOrUnchanged decides, for an owned object that differs from the
// desired state, whether a write would be pointless because the last write
// (w) already covers it. It returns a reason to skip, or "" to write:
//   - the cached object is still at the resourceVersion our last write
//     replaced (w.from, when the write moved it): the cache lags behind
//     that write, whose watch event re-queues the CR;
//   - the object was created by our last write (w.from empty) and the cache
//     does not have it yet: confirmed with one uncached GET, since a
//     configuration deleted by someone else must be recreated;
//   - the cached object is exactly the result of our last write
//     (resourceVersion w.to) of the same desired state (sameDesired): the
//     reported drift is a field the API server normalises, and applying
//     again would be a no-op write (this covers applies that did not move
//     the resourceVersion, where from == to).
//
// None of them is drift, so none spends the repair budget.
func (a *Applier) behindOrUnchanged(ctx context.Context, obj, live client.Object, created bool, w rvChange, sameDesired bool) (string, error) {
	switch {
	case created && w.from == "" && w.to != "":
		if a.APIReader == nil {
			return "", nil
		}
		probe := live.DeepCopyObject().(client.Object)
		err := a.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), probe)
		if apierrors.IsNotFound(err) {
			return "", nil // deleted since: create it again
		}
		if err != nil {
			return "", err
		}
		return "cache has not seen the object created by the last write; waiting for its event", nil
	case created:
		return "", nil
	case w.from != "" && w.from != w.to && live.GetResourceVersion() == w.from:
		return "cache behind the last write; waiting for its event", nil
	case sameDesired && w.to != "" && live.GetResourceVersion() == w.to:
		return "object is the result of the last write of the same desired state; drift is server normalisation", nil
	}
	return "", nil
}

// Forget drops what a remembers about the objects of one owner
// (repair times, applied hashes, written resourceVersions): the CR is gone.
func (a *Applier) Forget(ownerKind, ownerName string) {
	prefix := prefix(ownerKind, ownerName)
	owned := func(k string) bool { return strings.HasPrefix(k, prefix) }
	a.mu.Lock()
	defer a.mu.Unlock()
	maps.DeleteFunc(a.repairs, func(k string, _ []time.Time) bool { return owned(k) })
	maps.DeleteFunc(a.applied, func(k string, _ [sha256.Size]byte) bool { return owned(k) })
	maps.DeleteFunc(a.wrote, func(k string, _ rvChange) bool { return owned(k) })
}

// forgetKey drops what a remembers about one owned object
// (deleted because it is no longer desired).
func (a *Applier) forgetKey(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.repairs, key)
	delete(a.applied, key)
	delete(a.wrote, key)
}

// Remembered counts the entries of the repairs, applied and wrote maps
// (tests check that deleted CRs leave none behind).
func (a *Applier) Remembered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.repairs) + len(a.applied) + len(a.wrote)
}

// Delete deletes obj if it exists and owner controls it, with an Event.
func (a *Applier) Delete(ctx context.Context, owner Owner, obj client.Object) error {
	if err := a.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(obj, owner.Object) {
		return nil
	}
	if err := a.Client.Delete(ctx, obj, client.Preconditions{UID: ptrUID(obj.GetUID())}); err != nil {
		return client.IgnoreNotFound(err)
	}
	gvk, _ := apiutil.GVKForObject(obj, a.Scheme)
	a.forgetKey(key(owner, gvk.Kind, obj))
	a.Recorder.Eventf(owner.Object, nil, corev1.EventTypeNormal, eventDeleted, "Delete", "deleted %s %s/%s (no longer desired)", gvk.Kind, obj.GetNamespace(), obj.GetName())
	return nil
}
