package oversell

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Policy is one valid NodeOversell, compiled for the hot path.
type Policy struct {
	Name       string
	Generation int64
	Priority   int32
	Created    time.Time
	Selector   labels.Selector
	// Ratios per Resource; an unset Ratio leaves that resource at raw.
	Ratios [numResources]Ratio
	// Ceiling per Resource is the highest ratio a node target may reach
	// (target.go): the larger of Ratios and status.ratioCeiling, which
	// the operator keeps at the ratios in use while a lowered ratio is
	// held for running pods. Unset where both are.
	Ceiling [numResources]Ratio
	Trusted []string
}

// Ignored is a NodeOversell the snapshot left out, with the reason.
type Ignored struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	Reason     string `json:"reason"`
}

// Snapshot is an immutable view of all NodeOversell objects. Handlers read it
// through an atomic pointer, so a CR change applies to the next status write.
type Snapshot struct {
	// Synced is false until the informer has delivered its initial list.
	// Before that the handler must not treat "no policy" as "deselected".
	Synced bool
	// Policies are ordered by precedence: priority descending, then
	// creationTimestamp ascending, then name.
	Policies []*Policy
	Ignored  []Ignored
	// Deleting names NodeOversells with a deletionTimestamp, sorted: they
	// no longer amplify anything by their selector, so that the
	// operator's finalizer can restore their nodes without this server
	// amplifying them again.
	Deleting []string
	// Holders are the compiled policies of every NodeOversell, deleting
	// ones included, by name: a node labelled
	// v1alpha1.OversellNodeLabel=<name> with a target for it, which no
	// selector selects any more, is still served by that one (RouteNode)
	// until the operator releases it, so a cut held for running pods
	// stays held.
	Holders map[string]*Policy
	// ExtraTrusted are reporters trusted for every node (--trusted-reporter).
	ExtraTrusted []string
	// Hash identifies the served set of (name, generation) pairs.
	Hash string
}

// policyFor returns the policy that applies to a node with these labels, or nil.
// When several select the node, exactly one applies: the first in
// precedence order.
func (s *Snapshot) policyFor(nodeLabels map[string]string) *Policy {
	set := labels.Set(nodeLabels)
	for _, p := range s.Policies {
		if p.Selector.Matches(set) {
			return p
		}
	}
	return nil
}

// trustedFunc returns the trusted-reporter test for a node selected by p
// (p may be nil).
func (s *Snapshot) trustedFunc(p *Policy) func(string) bool {
	return func(user string) bool {
		if slices.Contains(s.ExtraTrusted, user) {
			return true
		}
		return p != nil && slices.Contains(p.Trusted, user)
	}
}

// CompilePolicy validates a NodeOversell and compiles it. It returns an
// error naming the bad field for a ratio outside 1..10, no ratio at all, or
// a selector that does not convert (metav1.LabelSelectorAsSelector).
func CompilePolicy(no *v1alpha1.NodeOversell) (*Policy, error) {
	no = no.WithDefaults() // as the API server serves it
	p := &Policy{
		Name:       no.Name,
		Generation: no.Generation,
		Priority:   no.Spec.Priority,
		Created:    no.CreationTimestamp.Time,
		Trusted:    slices.Clone(no.Spec.TrustedReporters),
	}
	for r, s := range [numResources]v1alpha1.Ratio{CPU: no.Spec.Ratios.CPU, Memory: no.Spec.Ratios.Memory} {
		if s == "" {
			continue
		}
		x, err := ParseRatio(string(s))
		if err != nil {
			return nil, fmt.Errorf("spec.ratios.%s: %w", resourceNames[r], err)
		}
		p.Ratios[r] = x
	}
	if !p.Ratios[CPU].IsSet() && !p.Ratios[Memory].IsSet() {
		return nil, errors.New("spec.ratios: at least one of cpu or memory is required")
	}
	p.Ceiling = p.Ratios
	if c := no.Status.RatioCeiling; c != nil {
		// Written by the operator; a value that does not parse is no
		// ceiling (spec.ratios alone bounds the node).
		for r, s := range [numResources]v1alpha1.Ratio{CPU: c.CPU, Memory: c.Memory} {
			if x, err := ParseRatio(string(s)); err == nil && x.micro > p.Ceiling[r].micro {
				p.Ceiling[r] = x
			}
		}
	}
	if no.Spec.NodeSelector == nil {
		// The API documents an absent selector as "every node";
		// LabelSelectorAsSelector(nil) would mean none.
		p.Selector = labels.Everything()
	} else {
		sel, err := metav1.LabelSelectorAsSelector(no.Spec.NodeSelector)
		if err != nil {
			return nil, fmt.Errorf("spec.nodeSelector: %w", err)
		}
		p.Selector = sel
	}
	return p, nil
}

// BuildSnapshot compiles objs into a snapshot. Invalid objects are listed in
// ignored instead of failing the whole set; objects being deleted are
// listed in Deleting and never become policies.
func BuildSnapshot(objs []*v1alpha1.NodeOversell, extraTrusted []string, synced bool) *Snapshot {
	s := &Snapshot{Synced: synced, ExtraTrusted: extraTrusted, Holders: map[string]*Policy{}}
	for _, o := range objs {
		p, err := CompilePolicy(o)
		if err == nil {
			s.Holders[o.Name] = p
		}
		if o.DeletionTimestamp != nil {
			s.Deleting = append(s.Deleting, o.Name)
			continue
		}
		if err != nil {
			s.Ignored = append(s.Ignored, Ignored{Name: o.Name, Generation: o.Generation, Reason: err.Error()})
			continue
		}
		s.Policies = append(s.Policies, p)
	}
	sort.Slice(s.Policies, func(i, j int) bool {
		a, b := s.Policies[i], s.Policies[j]
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Name < b.Name
	})
	sort.Slice(s.Ignored, func(i, j int) bool { return s.Ignored[i].Name < s.Ignored[j].Name })
	slices.Sort(s.Deleting)
	h := sha256.New()
	for _, p := range s.Policies {
		h.Write([]byte(p.Name))
		h.Write([]byte{0})
		h.Write(strconv.AppendInt(nil, p.Generation, 10))
		h.Write([]byte{0})
	}
	s.Hash = hex.EncodeToString(h.Sum(nil)[:8])
	return s
}

// Store holds the NodeOversell objects a watch delivers (Upsert, Remove,
// MarkSynced; webhooks/configwatch feeds it from the server's informer) and
// publishes a new snapshot on every add, update and delete.
type Store struct {
	log          logr.Logger
	metrics      *Metrics
	extraTrusted []string

	mu     sync.Mutex
	objs   map[string]*v1alpha1.NodeOversell
	synced bool

	snap atomic.Pointer[Snapshot]
}

// NewStore returns an unsynced, empty store. extraTrusted are user names
// trusted as raw reporters for every node; m may be nil.
func NewStore(extraTrusted []string, log logr.Logger, m *Metrics) *Store {
	s := &Store{log: log, metrics: m, extraTrusted: slices.Clone(extraTrusted), objs: map[string]*v1alpha1.NodeOversell{}}
	s.snap.Store(BuildSnapshot(nil, s.extraTrusted, false))
	return s
}

// snapshot returns the current snapshot; never nil.
func (s *Store) snapshot() *Snapshot { return s.snap.Load() }

// Upsert records an added or updated NodeOversell.
func (s *Store) Upsert(o *v1alpha1.NodeOversell) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs[o.Name] = o
	s.rebuildLocked()
}

// Remove forgets a NodeOversell by name.
func (s *Store) Remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, name)
	s.rebuildLocked()
}

// MarkSynced records that the watch's initial list was delivered: until
// then the handler treats no policy as unknown rather than deselected.
func (s *Store) MarkSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced = true
	s.rebuildLocked()
}

// Synced reports whether the store has seen the informer's initial list;
// it is the server's readiness condition.
func (s *Store) Synced() bool { return s.snapshot().Synced }

func (s *Store) rebuildLocked() {
	objs := make([]*v1alpha1.NodeOversell, 0, len(s.objs))
	for _, o := range s.objs {
		objs = append(objs, o)
	}
	snap := BuildSnapshot(objs, s.extraTrusted, s.synced)
	prev := s.snap.Swap(snap)
	for _, ig := range snap.Ignored {
		if prev != nil && slices.Contains(prev.Ignored, ig) {
			continue
		}
		s.log.Error(errors.New(ig.Reason), "NodeOversell ignored", "nodeOversell", ig.Name, "generation", ig.Generation)
		if s.metrics != nil {
			s.metrics.ConfigRejected.WithLabelValues(ig.Name).Inc()
		}
	}
	if s.metrics != nil {
		s.metrics.Policies.Set(float64(len(snap.Policies)))
	}
	s.log.V(1).Info("configuration snapshot rebuilt", "policies", len(snap.Policies), "ignored", len(snap.Ignored), "hash", snap.Hash)
}
