package oversell

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// restatement is a kubelet heartbeat on an amplified node (cpu 2, memory
// 1.5): the stored node (old) carries the amplified allocatable and
// heartbeats written 30 s before now, the admitted one (obj) the raw
// allocatable and heartbeats at now, as the kubelet's patch leaves it.
func restatement(now time.Time) (obj, old *corev1.Node) {
	ann := map[string]string{annRaw: `{"cpu":"7600m","memory":"30Gi"}`, annRatios: `{"cpu":"2","memory":"1.5"}`, annApplied: "oversell-pool"}
	old = realisticNode("n1", "15200m", "45Gi", ann)
	obj = realisticNode("n1", "7600m", "30Gi", ann)
	for i := range old.Status.Conditions {
		old.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(now.Add(-30 * time.Second).Truncate(time.Second))
		obj.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(now.Truncate(time.Second))
	}
	return obj, old
}

func holdHandler(t *testing.T, now time.Time) (*Handler, *Metrics) {
	h, m := testHandler(t, poolSnapshot(t))
	h.now = func() time.Time { return now }
	return h, m
}

func TestHoldRestatementLeavesStoredNode(t *testing.T) {
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	obj, old := restatement(now)
	// The field manager stamps the kubelet's entry; the API server reverts
	// a stamp alone.
	stamp := metav1.NewTime(now)
	obj.ManagedFields[2].Time = &stamp
	h, m := holdHandler(t, now)
	resp := decodeResponse(t, post(h, reviewFor(t, "system:node:n1", kubeletGroups, obj, old), "application/json"))
	got := patchedNode(t, obj, resp)
	got.ManagedFields[2].Time = old.ManagedFields[2].Time
	if !apiequality.Semantic.DeepEqual(got, old) {
		a, _ := json.Marshal(got.Status)
		b, _ := json.Marshal(old.Status)
		t.Fatalf("held node differs from the stored one:\n%s\n%s", a, b)
	}
	// Byte-equal too: the API server compares encodings.
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(old)
	if string(a) != string(b) {
		t.Fatalf("held node encodes differently from the stored one")
	}
	if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeHeld, "kubelet", string(reasonKubeletReport))); v != 1 {
		t.Fatalf("held count %v, want 1", v)
	}
}

// Every write that is more than a restatement goes through as before.
func TestHoldLetsRealWritesThrough(t *testing.T) {
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		edit   func(obj, old *corev1.Node)
		maxAge time.Duration
		user   string
	}{
		"heartbeat due": {edit: func(obj, old *corev1.Node) {
			old.Status.Conditions[2].LastHeartbeatTime = metav1.NewTime(now.Add(-DefaultMaxHeartbeatAge))
		}},
		"condition changed": {edit: func(obj, old *corev1.Node) {
			obj.Status.Conditions[3].Status, obj.Status.Conditions[3].LastTransitionTime = corev1.ConditionFalse, metav1.NewTime(now)
		}},
		"condition added": {edit: func(obj, old *corev1.Node) {
			obj.Status.Conditions = append(obj.Status.Conditions, corev1.NodeCondition{Type: "Extra", Status: corev1.ConditionTrue})
		}},
		"images changed": {edit: func(obj, old *corev1.Node) {
			obj.Status.Images = obj.Status.Images[1:]
		}},
		"raw changed": {edit: func(obj, old *corev1.Node) {
			obj.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("7")
		}},
		"pods allocatable changed": {edit: func(obj, old *corev1.Node) {
			obj.Status.Allocatable[corev1.ResourcePods] = resource.MustParse("100")
		}},
		"label changed": {edit: func(obj, old *corev1.Node) {
			obj.Labels["team"] = "other"
		}},
		"ownership changed": {edit: func(obj, old *corev1.Node) {
			obj.ManagedFields[2].FieldsV1 = &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:allocatable":{"f:cpu":{}}}}`)}
		}},
		"disabled": {edit: func(obj, old *corev1.Node) {}, maxAge: -1},
		"not a reporter": {edit: func(obj, old *corev1.Node) {
			obj.Status.Allocatable = old.Status.Allocatable.DeepCopy()
		}, user: "someone"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			obj, old := restatement(now)
			c.edit(obj, old)
			h, m := holdHandler(t, now)
			if c.maxAge != 0 {
				h.MaxHeartbeatAge = c.maxAge
			}
			user, groups := "system:node:n1", kubeletGroups
			if c.user != "" {
				user, groups = c.user, nil
			}
			resp := decodeResponse(t, post(h, reviewFor(t, user, groups, obj, old), "application/json"))
			if v := testutil.ToFloat64(m.Mutations.WithLabelValues(outcomeHeld, "kubelet", string(reasonKubeletReport))); v != 0 {
				t.Fatalf("held a real write")
			}
			got := obj
			if resp.Patch != nil {
				got = patchedNode(t, obj, resp)
			}
			for i := range got.Status.Conditions {
				if i < len(obj.Status.Conditions) && !got.Status.Conditions[i].LastHeartbeatTime.Equal(&obj.Status.Conditions[i].LastHeartbeatTime) {
					t.Fatalf("heartbeat of condition %d changed by a write that goes through", i)
				}
			}
		})
	}
}
