package podindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"weak"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestShapeShared: the replicas of one template share one shape; a pod
// that differs in anything the shape holds gets another one, and a pod
// that differs only in what the record itself holds does not.
func TestShapeShared(t *testing.T) {
	base := func() *corev1.Pod { return realisticPod(0) }
	ref := FromPod(base())
	cases := []struct {
		name string
		edit func(p *corev1.Pod)
		same bool
	}{
		{"another replica", func(p *corev1.Pod) {
			q := realisticPod(1)
			p.Name, p.UID, p.ResourceVersion, p.Spec.NodeName = q.Name, q.UID, q.ResourceVersion, q.Spec.NodeName
		}, true},
		{"other status", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodPending
			p.Status.Conditions = nil
			p.DeletionTimestamp = &metav1.Time{Time: t0}
			p.CreationTimestamp = metav1.NewTime(t0.Add(time.Hour))
		}, true},
		{"a foreign annotation", func(p *corev1.Pod) { p.Annotations["other.example.com/x"] = "y" }, true},
		{"another namespace", func(p *corev1.Pod) { p.Namespace = "elsewhere" }, true},
		{"cpu request", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("300m")
		}, false},
		{"memory format", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory] = resource.MustParse("67108864")
		}, false},
		{"guaranteed", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits = p.Spec.Containers[0].Resources.Requests.DeepCopy()
		}, false},
		{"a label", func(p *corev1.Pod) { p.Labels["version"] = "v4" }, false},
		{"our annotation", func(p *corev1.Pod) { p.Annotations["sidecar.hookwright.io/inject"] = "false" }, false},
		{"an image", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "app:2" }, false},
		{"the owner", func(p *corev1.Pod) { p.OwnerReferences[0].Name = "web-0-other" }, false},
		{"priority class", func(p *corev1.Pod) { p.Spec.PriorityClassName = "high" }, false},
		{"hostNetwork", func(p *corev1.Pod) { p.Spec.HostNetwork = true }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := base()
			c.edit(p)
			r := FromPod(p)
			if got := r.shape == ref.shape; got != c.same {
				t.Fatalf("shares the shape: %v, want %v", got, c.same)
			}
			if want := FromPod(p); want.shape != r.shape {
				t.Fatal("the same pod twice: two shapes")
			}
		})
	}
}

// TestShapeReadsBack: what the shape holds reads back through the
// record's methods, and a zero record reads as an empty pod.
func TestShapeReadsBack(t *testing.T) {
	p := pod("apps", "a", nil)
	p.Spec.PriorityClassName, p.Spec.HostNetwork = "high", true
	l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1G")}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: l, Limits: l}
	r := FromPod(p)
	if r.PriorityClass() != "high" || !r.HostNetwork() || !r.Guaranteed() || r.CPUMilli() != 2000 ||
		r.MemoryMilli() != 1e12 || r.ExclusiveCPUMilli() != 2000 || r.memoryFormat() != resource.DecimalSI {
		t.Fatalf("read back %q %v %v %d %d %d %q", r.PriorityClass(), r.HostNetwork(), r.Guaranteed(), r.CPUMilli(),
			r.MemoryMilli(), r.ExclusiveCPUMilli(), r.memoryFormat())
	}
	z := &Pod{}
	if v := z.View(); v.Name != "" || len(v.Labels) != 0 || v.Spec.HostNetwork || len(z.Requests()) != 0 || z.PriorityClass() != "" {
		t.Fatalf("a zero record: %+v", v)
	}
}

// TestOddIDsSideRecord: an odd UID or resourceVersion round-trips through
// the side record, a packed pair has none, and the side record goes when
// its record is collected (indexed and dropped, or never indexed).
func TestOddIDsSideRecord(t *testing.T) {
	cases := []struct {
		uid, rv string
		odd     bool
	}{
		{"0b5c2f63-3c1e-4d4e-9a34-000000000042", "7", false},
		{"uid-apps-a", "7", true},
		{"0b5c2f63-3c1e-4d4e-9a34-000000000042", "opaque", true},
		{"fake", "007", true},
	}
	for _, c := range cases {
		t.Run(c.uid+"/"+c.rv, func(t *testing.T) {
			p := pod("apps", "a", nil)
			p.UID, p.ResourceVersion = types.UID(c.uid), c.rv
			x := New()
			r := FromPod(p)
			x.Upsert(r)
			if r.odd != c.odd || (r.ids() != nil) != c.odd {
				t.Fatalf("odd %v, side record %v, want %v", r.odd, r.ids() != nil, c.odd)
			}
			if r.UID() != types.UID(c.uid) || r.ResourceVersion() != c.rv || !r.hasIDs(p.UID, c.rv) {
				t.Fatalf("got %q %q", r.UID(), r.ResourceVersion())
			}
			want := recordSize + len(p.Name)
			if c.odd {
				want += oddOverhead + len(r.ids().uid) + len(r.ids().rv)
			}
			if s := x.Stats(); s.Bytes != want+slotOverhead+x.byKey.bytes() {
				t.Fatalf("estimate %d bytes, want %d", s.Bytes, want+slotOverhead+x.byKey.bytes())
			}
			w := weak.Make(r)
			stray := weak.Make(FromPod(p)) // never indexed
			r = nil
			x.Delete("apps", "a")
			runtime.KeepAlive(x)
			for _, w := range []weak.Pointer[Pod]{w, stray} {
				if !collected(w) {
					t.Fatal("the side record outlived its record")
				}
			}
		})
	}
}

// collected waits for w's record to be collected and its cleanup to have
// dropped its side record.
func collected(w weak.Pointer[Pod]) bool {
	for range 100 {
		runtime.GC()
		oddMu.Lock()
		_, held := oddOf[w]
		oddMu.Unlock()
		if w.Value() == nil && !held {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// TestOddIDsManyRecords: side records of many records stay apart.
func TestOddIDsManyRecords(t *testing.T) {
	var rs []*Pod
	for i := range 100 {
		p := pod("apps", fmt.Sprint("p", i), nil)
		p.UID, p.ResourceVersion = types.UID(fmt.Sprint("uid-", i)), fmt.Sprint("rv-", i)
		rs = append(rs, FromPod(p))
	}
	for i, r := range rs {
		if r.UID() != types.UID(fmt.Sprint("uid-", i)) || r.ResourceVersion() != fmt.Sprint("rv-", i) {
			t.Fatalf("record %d: %q %q", i, r.UID(), r.ResourceVersion())
		}
	}
}

// TestKeyTable: random adds and removes against a map, through growth
// and many tombstones: every key held is found at its slot, every other
// one is not, and the table never fills.
func TestKeyTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kt := newKeyTable()
	var slots []*Pod
	var free []int32
	model := map[podKey]int32{}
	nss := []str{intern("a"), intern("b"), intern("kube-system")}
	key := func() podKey { return podKey{nss[rng.IntN(len(nss))], fmt.Sprintf("p-%d", rng.IntN(3000))} }
	for step := range 40000 {
		k := key()
		if i, ok := model[k]; ok && rng.IntN(2) == 0 {
			kt.remove(k, i)
			slots[i] = nil
			free = append(free, i)
			delete(model, k)
		} else if !ok {
			var i int32
			if n := len(free); n > 0 {
				i, free = free[n-1], free[:n-1]
			} else {
				slots = append(slots, nil)
				i = int32(len(slots) - 1)
			}
			kt.put(k, i, slots)
			slots[i] = &Pod{Namespace: k.ns, Name: k.name}
			model[k] = i
		}
		if kt.n != len(model) || kt.used*4 > len(kt.t)*3 {
			t.Fatalf("step %d: %d entries (%d used of %d), want %d", step, kt.n, kt.used, len(kt.t), len(model))
		}
		if step%997 == 0 {
			for k, want := range model {
				if got, ok := kt.get(k, slots); !ok || got != want {
					t.Fatalf("step %d: %v at %d %v, want %d", step, k, got, ok, want)
				}
			}
			if _, ok := kt.get(podKey{nss[0], "absent"}, slots); ok {
				t.Fatalf("step %d: found a key never added", step)
			}
		}
	}
}
