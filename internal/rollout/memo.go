package rollout

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
)

// memo is everything a Roller keeps between steps. None of it is the
// rollout's state (that lives in the cluster): each entry saves a read or
// a question to the API server, and a new leader starts with it empty.
type memo struct {
	mu sync.Mutex
	// allowed are SelfSubjectAccessReview answers by namespace and
	// strategy, kept permissionTTL.
	allowed map[string]permission
	// skipped remembers, per pod UID, a pod judged not to be acted on
	// (its resourceVersion and the revision then): a fleet of pods the
	// strategy cannot change is not read and planned again every step.
	skipped map[types.UID]skipMemo
	// owners are the owners in flight of each CR's last step, until its
	// status is written; didAct tells whether the last step acted.
	owners map[string][]string
	didAct map[string]bool
	// rsOwners caches each ReplicaSet's Deployment ("ReplicaSet/ns/name").
	rsOwners map[string]fleet.Owner
	// discovered is when each CR's owners were last listed, by
	// "name/revision".
	discovered map[string]time.Time
	// resizeWhy is why the server cannot resize pods in place ("" when it
	// can), once resizeKnown; resizeWarned are the CRs told.
	resizeKnown  bool
	resizeWhy    string
	resizeWarned map[string]bool
}

func newMemo() *memo {
	return &memo{allowed: map[string]permission{}, skipped: map[types.UID]skipMemo{},
		owners: map[string][]string{}, didAct: map[string]bool{}, rsOwners: map[string]fleet.Owner{},
		discovered: map[string]time.Time{}, resizeWarned: map[string]bool{}}
}

// permission is one namespace's answer: the first missing right, or "".
type permission struct {
	at      time.Time
	missing string
}

// skipMemo is a pod judged not to be acted on, and under what.
type skipMemo struct {
	resourceVersion, revision, strategy, reason string
}

func memoStrategy(spec *v1alpha1.RolloutSpec) string {
	return fmt.Sprintf("%s/%t", spec.Strategy, spec.FallbackToRestart)
}

// permission is key's answer if it is younger than ttl at now.
func (m *memo) permission(key string, now time.Time, ttl time.Duration) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.allowed[key]
	if !ok || now.Sub(p.at) >= ttl {
		return "", false
	}
	return p.missing, true
}

func (m *memo) setPermission(key string, p permission) {
	m.mu.Lock()
	m.allowed[key] = p
	m.mu.Unlock()
}

// skippedFor is the reason pod was skipped, if it was for this very
// resourceVersion, revision and strategy.
func (m *memo) skippedFor(uid types.UID, resourceVersion, rev string, spec *v1alpha1.RolloutSpec) (string, bool) {
	m.mu.Lock()
	s, ok := m.skipped[uid]
	m.mu.Unlock()
	if !ok || s.resourceVersion != resourceVersion || s.revision != rev || s.strategy != memoStrategy(spec) {
		return "", false
	}
	return s.reason, true
}

func (m *memo) skip(uid types.UID, resourceVersion, rev string, spec *v1alpha1.RolloutSpec, reason string) {
	m.mu.Lock()
	m.skipped[uid] = skipMemo{resourceVersion: resourceVersion, revision: rev, strategy: memoStrategy(spec), reason: reason}
	m.mu.Unlock()
}

// prune forgets the skipped pods no longer cached.
func (m *memo) prune(pods []Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.skipped) <= len(pods)+1000 {
		return
	}
	seen := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		seen[p.Pod.UID] = true
	}
	for uid := range m.skipped {
		if !seen[uid] {
			delete(m.skipped, uid)
		}
	}
}

// lastOwners are the owners in flight after name's last step.
func (m *memo) lastOwners(name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owners[name]
}

// stepped keeps what name's step left: its owners in flight, whether it
// acted.
func (m *memo) stepped(name string, owners []string, acted bool) {
	m.mu.Lock()
	m.owners[name] = owners
	m.didAct[name] = acted
	m.mu.Unlock()
}

func (m *memo) acted(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.didAct[name]
}

// forgetSteps drops name's last step.
func (m *memo) forgetSteps(name string) {
	m.mu.Lock()
	delete(m.owners, name)
	delete(m.didAct, name)
	m.mu.Unlock()
}

func (m *memo) rsOwner(key string) (fleet.Owner, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.rsOwners[key]
	return o, ok
}

func (m *memo) setRSOwner(key string, o fleet.Owner) {
	m.mu.Lock()
	if len(m.rsOwners) > 100000 {
		clear(m.rsOwners)
	}
	m.rsOwners[key] = o
	m.mu.Unlock()
}

// discoveredSince tells whether key's owners were listed less than every
// ago.
func (m *memo) discoveredSince(key string, now time.Time, every time.Duration) bool {
	m.mu.Lock()
	at, ok := m.discovered[key]
	m.mu.Unlock()
	return ok && now.Sub(at) < every
}

func (m *memo) setDiscovered(key string, at time.Time) {
	m.mu.Lock()
	if len(m.discovered) > 1000 {
		clear(m.discovered)
	}
	m.discovered[key] = at
	m.mu.Unlock()
}

// resize is why pods cannot be resized in place, asking ask until it
// answers (known true) once.
func (m *memo) resize(ask func() (why string, known bool)) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.resizeKnown {
		return m.resizeWhy
	}
	why, known := ask()
	if known {
		m.resizeWhy, m.resizeKnown = why, true
	}
	return why
}

// firstResizeWarning reports whether name has not been told yet, and
// marks it told.
func (m *memo) firstResizeWarning(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	warned := m.resizeWarned[name]
	m.resizeWarned[name] = true
	return !warned
}
