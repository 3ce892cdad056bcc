package oversell

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Node and user label values come from request bodies that any client
// reaching the Service can write: however many distinct names it sends,
// the series stay bounded (issue 11 §2). Without the bounds each name was
// a new series, held for the life of the process.
func TestMetricsLabelsBoundedAgainstRequestBodies(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	if m.nodes.max != maxNodeSeries || m.users.max != maxUserSeries {
		t.Fatalf("bounds %d/%d, want %d/%d", m.nodes.max, m.users.max, maxNodeSeries, maxUserSeries)
	}
	const nodes, users = 5, 3
	m.nodes, m.users = newLabelSet(nodes, maxNodeLabelBytes), newLabelSet(users, maxUserLabelBytes)

	ann := map[string]string{annRaw: `{"cpu":"7600m","memory":"30Gi"}`, annRatios: `{"cpu":"2","memory":"1.5"}`, annApplied: "oversell-pool"}
	old := realisticNode("n1", "15200m", "45Gi", ann)
	obj := realisticNode("n1", "30400m", "45Gi", ann)
	for i := range 20 {
		decodeResponse(t, post(h, reviewFor(t, fmt.Sprintf("attacker-%d", i), nil, obj, old), "application/json"))
	}
	if n := testutil.CollectAndCount(m.UntrustedAllocatableWrites); n != users+1 {
		t.Errorf("%d user series, want %d and %q", n, users, otherUser)
	}
	if v := testutil.ToFloat64(m.UntrustedAllocatableWrites.WithLabelValues(otherUser)); v != 20-users {
		t.Errorf("%q counted %v writes, want %d", otherUser, v, 20-users)
	}

	for i := range 20 {
		name := fmt.Sprintf("fake-%d", i)
		n := realisticNode(name, "7600m", "30Gi", nil)
		decodeResponse(t, post(h, reviewFor(t, "system:node:"+name, kubeletGroups, n, n), "application/json"))
	}
	// n1 took no node series: its writes were untrusted repairs.
	if got, want := testutil.CollectAndCount(m.RawAllocatable), 2*nodes; got != want {
		t.Errorf("%d raw allocatable series, want %d (%d nodes × cpu, memory)", got, want, nodes)
	}
	if v := testutil.ToFloat64(m.NodeSeriesDropped); v == 0 {
		t.Error("nodes beyond the bound were not counted as dropped")
	}
	if got := testutil.CollectAndCount(m.Ratio) + testutil.CollectAndCount(m.EffectiveAllocatable); got != 4*nodes {
		t.Errorf("%d ratio and effective series, want %d", got, 4*nodes)
	}
}

// A restored node frees its place in the bound.
func TestMetricsNodeBoundFreedOnRestore(t *testing.T) {
	_, m := testHandler(t, poolSnapshot(t))
	m.nodes = newLabelSet(1, maxNodeLabelBytes)
	var d Decision
	d.Present[CPU] = true
	m.observeNode("a", &d)
	m.observeNode("b", &d)
	if v := testutil.ToFloat64(m.NodeSeriesDropped); v != 1 {
		t.Fatalf("dropped %v, want 1", v)
	}
	m.observeNode("a", &Decision{Restore: true})
	m.observeNode("b", &d)
	if testutil.CollectAndCount(m.RawAllocatable) != 1 || testutil.ToFloat64(m.NodeSeriesDropped) != 1 {
		t.Fatalf("after restoring a, b was not admitted: %d series, %v dropped", testutil.CollectAndCount(m.RawAllocatable), testutil.ToFloat64(m.NodeSeriesDropped))
	}
}

// A bounded number of series is not bounded memory when each label value
// can be as long as a request body: 5,000 node names of 3 MiB would hold
// 15 GB. A name longer than a Node's (253 bytes) gets no series, a user
// name over maxUserLabelBytes counts under otherUser.
func TestMetricsLabelValuesBoundedInLength(t *testing.T) {
	h, m := testHandler(t, poolSnapshot(t))
	long := strings.Repeat("n", 64<<10)
	for i := range 3 {
		name := fmt.Sprintf("%d%s", i, long)
		n := realisticNode(name, "7600m", "30Gi", nil)
		decodeResponse(t, post(h, reviewFor(t, "system:node:"+name, kubeletGroups, n, n), "application/json"))
	}
	if got := testutil.CollectAndCount(m.RawAllocatable); got != 0 {
		t.Errorf("%d raw allocatable series for node names of 64 KiB, want 0", got)
	}
	if v := testutil.ToFloat64(m.NodeSeriesDropped); v != 3 {
		t.Errorf("dropped %v, want 3", v)
	}
	ok := realisticNode("n1", "7600m", "30Gi", nil)
	decodeResponse(t, post(h, reviewFor(t, "system:node:n1", kubeletGroups, ok, ok), "application/json"))
	if got := testutil.CollectAndCount(m.RawAllocatable); got != 2 {
		t.Errorf("%d raw allocatable series for a plain node, want 2", got)
	}

	ann := map[string]string{annRaw: `{"cpu":"7600m","memory":"30Gi"}`, annRatios: `{"cpu":"2","memory":"1.5"}`, annApplied: "oversell-pool"}
	old := realisticNode("n1", "15200m", "45Gi", ann)
	obj := realisticNode("n1", "30400m", "45Gi", ann)
	decodeResponse(t, post(h, reviewFor(t, long, nil, obj, old), "application/json"))
	if n := testutil.CollectAndCount(m.UntrustedAllocatableWrites); n != 1 {
		t.Errorf("%d user series, want 1", n)
	}
	if v := testutil.ToFloat64(m.UntrustedAllocatableWrites.WithLabelValues(otherUser)); v != 1 {
		t.Errorf("a 64 KiB user name was not counted under %q (%v)", otherUser, v)
	}
}
