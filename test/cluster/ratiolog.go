package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// RatioChange is one change of a node's cpu target as the operator wrote
// it in the v1alpha1.OversellTarget annotation.
type RatioChange struct {
	// Ratio and Source are the target's cpu ratio and its source.
	Ratio, Source string
	// Changed is the operator's own stamp of the change (RFC 3339, whole
	// seconds); zero if it wrote none.
	Changed time.Time
}

func (c RatioChange) String() string { return c.Ratio + "(" + c.Source + ")" }

// RatioLog records every cpu ratio a node's target annotation goes
// through (and every version of the annotation), from a watch of that
// node: a watch delivers every version in
// order, so no intermediate ratio is missed however slow the machine, and
// the times are the operator's stamps, not when a test happened to look.
type RatioLog struct {
	mu      sync.Mutex
	changes []RatioChange
	targets []v1alpha1.OversellTarget
	last    string
	err     error
}

// WatchRatios starts a RatioLog of node until ctx ends. It lists the node
// first, so every change after WatchRatios returns is recorded (a target
// already present is the first entry).
func WatchRatios(ctx context.Context, cs kubernetes.Interface, node string) (*RatioLog, error) {
	sel := fields.OneTermEqualSelector("metadata.name", node).String()
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	l := &RatioLog{}
	for i := range list.Items {
		l.observe(&list.Items[i])
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return cs.CoreV1().Nodes().Watch(ctx, o)
		},
	})
	if err != nil {
		return nil, err
	}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				switch o := ev.Object.(type) {
				case *corev1.Node:
					l.observe(o)
				case *metav1.Status:
					// A watch too old to resume (410): the log can no
					// longer claim it saw every change.
					l.mu.Lock()
					l.err = fmt.Errorf("watch of node %s ended: %s", node, o.Message)
					l.mu.Unlock()
					return
				}
			}
		}
	}()
	return l, nil
}

func (l *RatioLog) observe(n *corev1.Node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	raw := n.Annotations[v1alpha1.OversellTargetKey]
	t := &v1alpha1.OversellTarget{}
	if json.Unmarshal([]byte(raw), t) != nil || t.CPU == nil {
		return
	}
	if raw != l.last {
		l.targets = append(l.targets, *t)
		l.last = raw
	}
	if k := len(l.changes); k > 0 && l.changes[k-1].Ratio == t.CPU.Ratio {
		return
	}
	c := RatioChange{Ratio: t.CPU.Ratio, Source: t.CPU.Source}
	c.Changed, _ = time.Parse(time.RFC3339, t.CPU.Changed)
	l.changes = append(l.changes, c)
}

// Changes returns the changes recorded so far and the error that ended
// the watch early, if any.
func (l *RatioLog) Changes() ([]RatioChange, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]RatioChange(nil), l.changes...), l.err
}

// Targets returns every distinct target annotation seen so far, in order
// (pressure and hold stamps change without a ratio change).
func (l *RatioLog) Targets() []v1alpha1.OversellTarget {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]v1alpha1.OversellTarget(nil), l.targets...)
}

// CheckRatioSteps judges changes: the ratios went through want, each
// change at most maxStep (millionths of a ratio) and, by the operator's
// stamps, at least minInterval after the previous one (the first entry's
// stamp is the NodeOversell's first write). It returns nil or an error
// naming every violation.
func CheckRatioSteps(changes []RatioChange, want []string, maxStep int64, minInterval time.Duration) error {
	var errs, got, ratios []string
	for i, c := range changes {
		got = append(got, c.String())
		ratios = append(ratios, c.Ratio)
		if i == 0 {
			continue
		}
		p := changes[i-1]
		d := ratioMicro(c.Ratio) - ratioMicro(p.Ratio)
		if d > maxStep || -d > maxStep {
			errs = append(errs, fmt.Sprintf("step %s -> %s is larger than %d millionths", p.Ratio, c.Ratio, maxStep))
		}
		if p.Changed.IsZero() || c.Changed.IsZero() {
			errs = append(errs, fmt.Sprintf("change %s -> %s: no stamp (%s, %s)", p.Ratio, c.Ratio, p.Changed, c.Changed))
		} else if gap := c.Changed.Sub(p.Changed); gap < minInterval {
			errs = append(errs, fmt.Sprintf("change %s -> %s stamped %s after the previous one (minChangeInterval %s)", p.Ratio, c.Ratio, gap, minInterval))
		}
	}
	if strings.Join(ratios, " ") != strings.Join(want, " ") {
		errs = append(errs, fmt.Sprintf("ratios went %v, want %v", got, want))
	}
	if len(errs) > 0 {
		return fmt.Errorf("ratio changes %v: %s", got, strings.Join(errs, "; "))
	}
	return nil
}

// FormatRatioSteps writes changes as "2 (static) → 1.5 (usage) +12s → …",
// each gap from the operator's stamps.
func FormatRatioSteps(changes []RatioChange) string {
	var b strings.Builder
	for i, c := range changes {
		if i > 0 {
			b.WriteString(" → ")
		}
		b.WriteString(c.Ratio + " (" + c.Source + ")")
		if i > 0 && !c.Changed.IsZero() && !changes[i-1].Changed.IsZero() {
			b.WriteString(" +" + c.Changed.Sub(changes[i-1].Changed).String())
		}
	}
	return b.String()
}

// ratioMicro parses a ratio ("1.5") into millionths; -1 if malformed.
func ratioMicro(s string) int64 {
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) > 6 {
		return -1
	}
	v, err := strconv.ParseInt(whole+frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	if err != nil {
		return -1
	}
	return v
}
