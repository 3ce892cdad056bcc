package podindex

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/internal/usageratio"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func testCR(name, image string, nsSel map[string]string) *v1alpha1.SidecarInjector {
	cr := &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SidecarInjectorSpec{
			NeverInjectSelector: []metav1.LabelSelector{{MatchLabels: map[string]string{"role": "migration"}}},
			DefaultTemplates:    []string{"proxy"},
			Values:              &apiextensionsv1.JSON{Raw: fmt.Appendf(nil, `{"image":%q}`, image)},
			Templates:           []v1alpha1.NamedTemplate{{Name: "proxy", Template: "spec:\n  containers:\n  - name: proxy\n    image: {{ .Values.image | quote }}\n"}},
		},
	}
	if nsSel != nil {
		cr.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsSel}
	}
	return cr
}

func testInjector(t testing.TB, name, image string, nsSel map[string]string) fleet.Injector {
	t.Helper()
	cr := testCR(name, image, nsSel)
	cfg, err := sidecar.Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := sidecar.Revision(cr)
	return fleet.Injector{Config: cfg, Params: sidecar.Params{OperatorNamespace: "hookwright-system"}, Revision: rev}
}

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func pod(ns, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, UID: types.UID("uid-" + ns + "-" + name),
			ResourceVersion: "1", CreationTimestamp: metav1.NewTime(t0)},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "app:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func inject(t testing.TB, inj fleet.Injector, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	raw, _ := json.Marshal(p)
	res, err := sidecar.Inject(inj.Config, inj.Params, sidecar.Input{Raw: raw, Namespace: p.Namespace, WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatalf("inject %s: %v %+v", p.Name, err, res)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(res.JSON, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// recount is the reference: fleet.Classify on the full pods and
// fleet.Summarize, as the fleet reconcile did before the index.
func recount(inj fleet.Injector, pods map[string]*corev1.Pod, nss map[string]map[string]string) fleet.Summary {
	var cs []fleet.Pod
	for _, p := range pods {
		if c, ok := fleet.Classify(inj, p, nss[p.Namespace]); ok {
			cs = append(cs, c)
		}
	}
	return fleet.Summarize(cs)
}

func TestViewCarriesWhatClassifyReads(t *testing.T) {
	cur := testInjector(t, "mesh", "proxy:2", map[string]string{"inject": "on"})
	old := testInjector(t, "mesh", "proxy:1", map[string]string{"inject": "on"})
	on := map[string]string{"inject": "on"}
	cases := map[string]*corev1.Pod{
		"missing":  pod("apps", "a", map[string]string{"app": "a"}),
		"current":  inject(t, cur, pod("apps", "b", nil)),
		"outdated": inject(t, old, pod("apps", "c", nil)),
		"orphaned": func() *corev1.Pod {
			p := inject(t, cur, pod("apps", "d", nil))
			p.Labels["role"] = "migration"
			return p
		}(),
		"optedout": func() *corev1.Pod {
			p := pod("apps", "e", nil)
			p.Annotations = map[string]string{v1alpha1.SidecarInjectKey: "false"}
			return p
		}(),
		"hostnet":  func() *corev1.Pod { p := pod("apps", "f", nil); p.Spec.HostNetwork = true; return p }(),
		"deleting": func() *corev1.Pod { p := pod("apps", "g", nil); p.DeletionTimestamp = &metav1.Time{Time: t0}; return p }(),
		"stale": func() *corev1.Pod {
			p := inject(t, cur, pod("apps", "h", nil))
			p.Spec.Containers = p.Spec.Containers[:1]
			return p
		}(),
		"system":    pod("kube-system", "i", nil),
		"foreignNS": pod("other", "j", nil),
		"critical": func() *corev1.Pod {
			p := pod("apps", "k", nil)
			p.Spec.PriorityClassName = v1alpha1.PriorityNodeCritical
			return p
		}(),
		"mirror": func() *corev1.Pod {
			p := pod("apps", "l", nil)
			p.Annotations = map[string]string{v1alpha1.MirrorPodAnnotation: "0a1b", "other": "x"}
			return p
		}(),
		"criticalInjected": func() *corev1.Pod {
			p := inject(t, cur, pod("apps", "m", nil))
			p.Spec.PriorityClassName = v1alpha1.PriorityClusterCritical
			return p
		}(),
	}
	nss := map[string]map[string]string{"apps": on, "kube-system": on, "other": {}}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			want, wok := fleet.Classify(cur, p, nss[p.Namespace])
			got, gok := fleet.Classify(cur, FromPod(p).View(), nss[p.Namespace])
			want.Created, got.Created = want.Created.UTC(), got.Created.UTC()
			if wok != gok || !reflect.DeepEqual(want, got) {
				t.Fatalf("view classifies %+v %v, the full pod %+v %v", got, gok, want, wok)
			}
		})
	}
}

func TestCountsFollowEvents(t *testing.T) {
	cur := testInjector(t, "mesh", "proxy:2", nil)
	x := New()
	if ch := x.SetInjector("mesh", "1", cur, false); ch {
		t.Fatal("an empty index moved counts")
	}
	x.SetNamespace("apps", map[string]string{})
	if ch := x.Upsert(FromPod(pod("apps", "a", nil))); !reflect.DeepEqual(ch, Changes{"mesh"}) {
		t.Fatalf("a new missing pod: changes %v", ch)
	}
	// The same pod again (a status update): nothing moved.
	if ch := x.Upsert(FromPod(pod("apps", "a", nil))); len(ch) != 0 {
		t.Fatalf("an unchanged pod: changes %v", ch)
	}
	c, _ := x.Counts("mesh")
	if c.MissingPods != 1 || c.MatchedPods != 1 {
		t.Fatalf("counts %+v", c)
	}
	x.Upsert(FromPod(inject(t, cur, pod("apps", "a", nil))))
	if c, _ = x.Counts("mesh"); c.CurrentPods != 1 || c.MissingPods != 0 {
		t.Fatalf("after injection %+v", c)
	}
	done := pod("apps", "a", nil)
	done.Status.Phase = corev1.PodSucceeded
	if ch := x.Upsert(FromPod(done)); !reflect.DeepEqual(ch, Changes{"mesh"}) || x.Stats().Pods != 0 {
		t.Fatalf("a finished pod stays: %v %+v", ch, x.Stats())
	}
	if c, _ = x.Counts("mesh"); c != (v1alpha1.FleetCounts{}) {
		t.Fatalf("counts after the pod finished %+v", c)
	}
	if _, ok := x.Node("node-1"); ok {
		t.Fatal("node-1 still has requests")
	}
}

func TestNodeRequests(t *testing.T) {
	x := New()
	a, b := pod("apps", "a", nil), pod("apps", "b", nil)
	b.Spec.InitContainers = []corev1.Container{{Name: "side", RestartPolicy: func() *corev1.ContainerRestartPolicy { p := corev1.ContainerRestartPolicyAlways; return &p }(),
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}
	pending := pod("apps", "c", nil)
	pending.Spec.NodeName = ""
	for _, p := range []*corev1.Pod{a, b, pending} {
		x.Upsert(FromPod(p))
	}
	n, ok := x.Node("node-1")
	if !ok || n.CPU.String() != "600m" || n.Memory.String() != "128Mi" || len(n.Pods) != 2 {
		t.Fatalf("node-1: %s %s %v", n.CPU.String(), n.Memory.String(), n.Pods)
	}
	want := usageratio.PodRequests(b)
	if got := n.Pods["apps/b"]; got.Cpu().Cmp(*want.Cpu()) != 0 || got.Memory().Cmp(*want.Memory()) != 0 {
		t.Fatalf("apps/b requests %v, want %v", got, want)
	}
	x.Delete("apps", "a")
	if n, _ = x.Node("node-1"); n.CPU.String() != "350m" {
		t.Fatalf("after a delete: %s", n.CPU.String())
	}
}

func TestGuaranteedExclusiveCPU(t *testing.T) {
	p := pod("apps", "g", nil)
	l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi")}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: l, Limits: l}
	r := FromPod(p)
	if !r.Guaranteed() || r.ExclusiveCPUMilli() != 2000 {
		t.Fatalf("guaranteed %v exclusive %d", r.Guaranteed(), r.ExclusiveCPUMilli())
	}
	if r = FromPod(pod("apps", "b", nil)); r.Guaranteed() || r.ExclusiveCPUMilli() != 0 {
		t.Fatalf("burstable: guaranteed %v exclusive %d", r.Guaranteed(), r.ExclusiveCPUMilli())
	}
}

// The property: after any sequence of pod adds, updates, deletes,
// namespace relabels and injector changes, every injector's summary equals
// a from-scratch recount of the full pods.
func TestCountsEqualRecount(t *testing.T) {
	images := []string{"proxy:1", "proxy:2"}
	injs := map[string][]fleet.Injector{}
	for _, name := range []string{"mesh", "other"} {
		var sel map[string]string
		if name == "other" {
			sel = map[string]string{"team": "b"}
		}
		for _, img := range images {
			injs[name] = append(injs[name], testInjector(t, name, img, sel))
		}
	}
	nsNames := []string{"ns-a", "ns-b", "ns-c", "kube-system"}
	labelSets := []map[string]string{nil, {"app": "web"}, {"role": "migration"}, {v1alpha1.SidecarInjectKey: "false"}, {v1alpha1.SidecarInjectKey: "true", "app": "x"}}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		x := New()
		pods := map[string]*corev1.Pod{}
		nss := map[string]map[string]string{}
		cur := map[string]int{}
		for name := range injs {
			cur[name] = rng.IntN(2)
			x.SetInjector(name, fmt.Sprint(cur[name]), injs[name][cur[name]], false)
		}
		for step := range 300 {
			switch op := rng.IntN(22); {
			case op < 10: // add or update a pod
				ns := nsNames[rng.IntN(len(nsNames))]
				name := fmt.Sprintf("p%d", rng.IntN(30))
				p := pod(ns, name, nil)
				for k, v := range labelSets[rng.IntN(len(labelSets))] {
					if p.Labels == nil {
						p.Labels = map[string]string{}
					}
					p.Labels[k] = v
				}
				switch rng.IntN(7) {
				case 0:
					names := []string{"mesh", "other"}
					n := names[rng.IntN(2)]
					// Injected elsewhere (kube-system is never injected), as a
					// copied pod spec would be.
					p = inject(t, injs[n][rng.IntN(2)], pod("ns-a", name, nil))
					p.Namespace = ns
				case 1:
					p.Status.Phase = corev1.PodSucceeded
				case 2:
					p.Spec.HostNetwork = true
				case 3:
					p.Annotations = map[string]string{"big": strings.Repeat("x", 100), v1alpha1.SidecarInjectKey: "yes"}
				case 4: // spared by the webhook configuration
					p.Spec.PriorityClassName = []string{v1alpha1.PriorityNodeCritical, "high"}[rng.IntN(2)]
				case 5:
					p.Annotations = map[string]string{v1alpha1.MirrorPodAnnotation: fmt.Sprint(rng.IntN(3))}
				}
				// Every version its own resourceVersion, as the API server
				// writes them: Record then reuses exactly the unchanged pods.
				p.ResourceVersion = fmt.Sprint(100 + step)
				if p.Status.Phase == corev1.PodSucceeded {
					delete(pods, ns+"/"+name)
				} else {
					pods[ns+"/"+name] = p
				}
				x.Upsert(x.Record(p))
			case op < 14: // delete
				for k := range pods {
					ns, name, _ := strings.Cut(k, "/")
					delete(pods, k)
					x.Delete(ns, name)
					break
				}
			case op < 17: // relabel a namespace
				ns := nsNames[rng.IntN(len(nsNames))]
				l := map[string]string{}
				if rng.IntN(2) == 0 {
					l["team"] = "b"
				}
				if rng.IntN(4) == 0 {
					delete(nss, ns)
					x.SetNamespace(ns, nil)
				} else {
					nss[ns] = l
					x.SetNamespace(ns, l)
				}
			case op < 19: // an injector's template changed
				for name := range injs {
					cur[name] = 1 - cur[name]
					x.SetInjector(name, fmt.Sprint(cur[name]), injs[name][cur[name]], false)
					break
				}
			case op < 21: // a re-list
				var all []*Pod
				for _, p := range pods {
					all = append(all, x.Record(p))
				}
				x.Replace(all)
			default: // a streamed re-list that fails part way and is retried
				failed := x.BeginList()
				n := 0
				for _, p := range pods {
					if n++; n > len(pods)/2 {
						break
					}
					failed.Add(x.Record(p))
				}
				retry := x.BeginList()
				failed.Add(FromPod(pod("ns-a", "left-by-the-failed-stream", nil)))
				if ch := failed.End(); ch != nil {
					t.Fatalf("seed %d step %d: the failed list's End reported %v", seed, step, ch)
				}
				for _, p := range pods {
					retry.Add(x.Record(p))
				}
				retry.End()
			}
			for name := range injs {
				got, _ := x.Summary(name)
				want := recount(injs[name][cur[name]], pods, nss)
				if !reflect.DeepEqual(norm(got), norm(want)) {
					t.Fatalf("seed %d step %d %s:\n got %+v\nwant %+v", seed, step, name, got, want)
				}
			}
			if x.Stats().Pods != len(pods) {
				t.Fatalf("seed %d step %d: %d pods indexed, %d alive", seed, step, x.Stats().Pods, len(pods))
			}
		}
	}
}

// norm puts creation times in UTC (a decoded pod's are local) and empty
// lists as nil.
func norm(s fleet.Summary) fleet.Summary {
	for _, l := range []*[]fleet.Pod{&s.Outdated, &s.Missing} {
		if len(*l) == 0 {
			*l = nil
		}
		for i := range *l {
			(*l)[i].Created = (*l)[i].Created.UTC()
		}
	}
	return s
}

// worstPod has hundreds of labels and 256 KiB of annotations, ours
// included: the index keeps the labels and our annotations only.
func worstPod(i int) *corev1.Pod {
	p := pod(fmt.Sprintf("ns-%d", i%100), fmt.Sprintf("worst-%06d", i), map[string]string{})
	for j := range 300 {
		p.Labels[fmt.Sprintf("label-%03d.example.com/key", j)] = fmt.Sprintf("value-%03d-%d", j, i)
	}
	p.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("a", 256<<10),
		v1alpha1.SidecarInjectKey: "true"}
	return p
}

// realisticPod is a Deployment pod as the API server returns it.
func realisticPod(i int) *corev1.Pod {
	p := pod(fmt.Sprintf("ns-%d", i%100), fmt.Sprintf("web-%d-7d9f8c6b5-%05d", i/50, i), map[string]string{
		"app": fmt.Sprintf("web-%d", i/50), "pod-template-hash": "7d9f8c6b5", "app.kubernetes.io/name": "web", "version": "v3"})
	p.UID = types.UID(fmt.Sprintf("0b5c2f63-3c1e-4d4e-9a34-%012d", i))
	p.ResourceVersion = fmt.Sprint(1000000 + i)
	p.Spec.NodeName = fmt.Sprintf("node-%d", i%200)
	p.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: fmt.Sprintf("web-%d-7d9f8c6b5", i/50), UID: "9e6e2d1a", Controller: new(true)}}
	for j := range 8 {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", j), Value: strings.Repeat("v", 24)})
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	return p
}

// benchIndex indexes b.N pods built by mk with 50 injectors and reports
// the heap bytes the index holds per pod (after a GC, the pods dropped).
func benchIndex(b *testing.B, mk func(int) *corev1.Pod) {
	x := New()
	for i := range 50 {
		x.SetInjector(fmt.Sprint("inj-", i), "1", testInjector(b, fmt.Sprint("inj-", i), "proxy:1", map[string]string{"team": fmt.Sprint(i)}), false)
	}
	for i := range 100 {
		x.SetNamespace(fmt.Sprintf("ns-%d", i), map[string]string{"team": fmt.Sprint(i % 50)})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := range b.N {
		x.Upsert(FromPod(mk(i)))
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "heap-bytes/pod")
	b.ReportMetric(float64(x.Stats().Bytes)/float64(b.N), "est-bytes/pod")
	runtime.KeepAlive(x)
}

func BenchmarkIndexRealisticPod(b *testing.B) { benchIndex(b, realisticPod) }

// BenchmarkIndexInjectedPod: the same pod carrying an injector's sidecar
// and status annotation (each injector's decision reads the annotation).
func BenchmarkIndexInjectedPod(b *testing.B) {
	inj := testInjector(b, "inj-0", "proxy:1", nil)
	tmpl := inject(b, inj, realisticPod(0))
	benchIndex(b, func(i int) *corev1.Pod {
		p := tmpl.DeepCopy()
		q := realisticPod(i)
		p.Namespace, p.Name, p.UID, p.ResourceVersion, p.Labels = q.Namespace, q.Name, q.UID, q.ResourceVersion, q.Labels
		return p
	})
}

func BenchmarkIndexWorstPod(b *testing.B) { benchIndex(b, worstPod) }

// BenchmarkReclassify is an injector change at 10,000 pods: every pod
// classified once more (replicas of one template once). Unique: every
// pod its own template. Interleaved: 40,000 pods of 4 templates spread
// over 5,000 namespaces in creation order (pod i in namespace i%5000, as
// the pod sweep creates them), so 20,000 keys none of which is adjacent.
func BenchmarkReclassify(b *testing.B) {
	b.Run("Unique", func(b *testing.B) { benchReclassify(b, 10000, realisticPod) })
	b.Run("Interleaved", func(b *testing.B) {
		benchReclassify(b, 40000, func(i int) *corev1.Pod {
			p := realisticPod(i % 4)
			p.Namespace, p.Name = fmt.Sprintf("ns-%d", i%5000), fmt.Sprintf("web-%06d", i)
			return p
		})
	})
}

func benchReclassify(b *testing.B, n int, mk func(int) *corev1.Pod) {
	x := New()
	for i := range n {
		x.Upsert(FromPod(mk(i)))
	}
	injs := []fleet.Injector{testInjector(b, "mesh", "proxy:1", nil), testInjector(b, "mesh", "proxy:2", nil)}
	b.ResetTimer()
	for i := range b.N {
		x.SetInjector("mesh", fmt.Sprint(i), injs[i%2], false)
	}
}

// BenchmarkReplace is a leader's initial sync (or a re-sync) of 20,000
// compacted pods into an index with 50 injectors: ReplicaSets of 50
// replicas, each in its own namespace, in the API server's key order
// (Replicas) or in no order (ReplicasShuffled, as a stream's temporary
// store hands them over), and the worst case for the index, every pod
// with a template of its own (Unique).
func BenchmarkReplace(b *testing.B) {
	b.Run("Replicas", func(b *testing.B) {
		benchReplace(b, func(i int) *corev1.Pod {
			p := realisticPod(i)
			p.Namespace = fmt.Sprintf("ns-%d", i/50%100)
			return p
		})
	})
	b.Run("ReplicasShuffled", func(b *testing.B) {
		benchReplace(b, func(i int) *corev1.Pod {
			p := realisticPod(i)
			p.Namespace = fmt.Sprintf("ns-%d", i/50%100)
			return p
		}, true)
	})
	b.Run("Unique", func(b *testing.B) { benchReplace(b, realisticPod) })
}

// benchReplace lists the pods mk builds in key order, or shuffled as a
// stream (WatchList) hands them over.
func benchReplace(b *testing.B, mk func(int) *corev1.Pod, shuffled ...bool) {
	const n = 20000
	recs := make([]*Pod, n)
	for i := range recs {
		recs[i] = FromPod(mk(i))
	}
	slices.SortFunc(recs, func(a, b *Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace.String(), b.Namespace.String()), cmp.Compare(a.Name, b.Name))
	})
	if len(shuffled) > 0 {
		r := rand.New(rand.NewPCG(1, 2))
		r.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	}
	// Building the records is not the list's work.
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		x := New()
		for i := range 50 {
			x.SetInjector(fmt.Sprint("inj-", i), "1", testInjector(b, fmt.Sprint("inj-", i), "proxy:1", map[string]string{"team": fmt.Sprint(i)}), false)
		}
		for i := range 100 {
			x.SetNamespace(fmt.Sprintf("ns-%d", i), map[string]string{"team": fmt.Sprint(i % 50)})
		}
		list := slices.Clone(recs)
		b.StartTimer()
		x.Replace(list)
		runtime.KeepAlive(x)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/pod")
}

// idCases are UIDs and resourceVersions in the API server's form
// (packed) and in others (kept as written).
var idCases = []struct {
	uid, rv string
	packed  bool
}{
	{"0b5c2f63-3c1e-4d4e-9a34-000000000042", "1234567", true},
	{"", "", true},
	{"ffffffff-ffff-ffff-ffff-ffffffffffff", "0", true},
	{"0B5C2F63-3C1E-4D4E-9A34-000000000042", "1", false}, // uppercase: kept as written
	{"00000000-0000-0000-0000-000000000000", "1", false}, // the zero UUID
	{"uid-apps-a", "1", false},
	{"0b5c2f63-3c1e-4d4e-9a34-00000000004g", "1", false},
	{"0b5c2f63x3c1e-4d4e-9a34-000000000042", "1", false},
	{"0b5c2f63-3c1e-4d4e-9a34-000000000042", "0012", false}, // leading zeros
	{"0b5c2f63-3c1e-4d4e-9a34-000000000042", "18446744073709551615", false},
	{"0b5c2f63-3c1e-4d4e-9a34-000000000042", "-1", false},
	{"0b5c2f63-3c1e-4d4e-9a34-000000000042", "opaque", false},
}

// TestIDsRoundTrip: a record gives back the UID and resourceVersion it
// was built from, packed or not.
func TestIDsRoundTrip(t *testing.T) {
	for _, c := range idCases {
		p := pod("apps", "a", nil)
		p.UID, p.ResourceVersion = types.UID(c.uid), c.rv
		r := FromPod(p)
		if r.UID() != types.UID(c.uid) || r.ResourceVersion() != c.rv {
			t.Errorf("%q %q: got %q %q", c.uid, c.rv, r.UID(), r.ResourceVersion())
		}
		if v := r.View(); v.UID != types.UID(c.uid) || v.ResourceVersion != c.rv {
			t.Errorf("%q %q: view %q %q", c.uid, c.rv, v.UID, v.ResourceVersion)
		}
		if (r.ids() == nil) != c.packed {
			t.Errorf("%q %q: packed %v, want %v", c.uid, c.rv, r.ids() == nil, c.packed)
		}
	}
}

// TestHasIDs: a record's hasIDs answers as comparing UID() and
// ResourceVersion() would, for every pair of packed and odd IDs.
func TestHasIDs(t *testing.T) {
	for _, a := range idCases {
		p := pod("apps", "a", nil)
		p.UID, p.ResourceVersion = types.UID(a.uid), a.rv
		r := FromPod(p)
		for _, b := range idCases {
			want := r.UID() == types.UID(b.uid) && r.ResourceVersion() == b.rv
			if got := r.hasIDs(types.UID(b.uid), b.rv); got != want {
				t.Errorf("record %q %q asked %q %q: %v, want %v", a.uid, a.rv, b.uid, b.rv, got, want)
			}
		}
	}
	r := FromPod(realisticPod(0))
	uid, rv := r.UID(), r.ResourceVersion()
	if n := testing.AllocsPerRun(100, func() { r.hasIDs(uid, rv) }); n != 0 {
		t.Errorf("hasIDs: %v allocations, want none", n)
	}
}

// TestPhaseAndFormat: every phase and memory format reads back; a phase
// Kubernetes does not define reads as Unknown.
func TestPhaseAndFormat(t *testing.T) {
	for _, ph := range append(slices.Clone(phases), "Evicted") {
		p := pod("apps", "a", nil)
		p.Status.Phase = ph
		want := ph
		if ph == "Evicted" {
			want = corev1.PodUnknown
		}
		if got := FromPod(p).Phase(); got != want {
			t.Errorf("phase %q: got %q", ph, got)
		}
	}
	for _, q := range []string{"64Mi", "64M", "6e7", "100"} {
		p := pod("apps", "a", nil)
		p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory] = resource.MustParse(q)
		got := FromPod(p).Requests()[corev1.ResourceMemory]
		if want := resource.MustParse(q); got.String() != want.String() {
			t.Errorf("memory %s: got %s", q, got.String())
		}
	}
}

// TestRecordSize guards the record's size: a field added to Pod costs
// every pod of the cluster (docs/scale.md).
func TestRecordSize(t *testing.T) {
	if recordSize > 80 {
		t.Fatalf("Pod is %d bytes, want at most 80 (the 80-byte size class)", recordSize)
	}
}

// TestRecordReusedForUnchangedPod: a re-sync hands the index the records
// it holds for pods that did not change (same UID and resourceVersion),
// and Replace keeps their states and counts; a changed pod gets a record
// of its own and is classified again.
func TestRecordReusedForUnchangedPod(t *testing.T) {
	cur := testInjector(t, "mesh", "proxy:2", nil)
	x := New()
	x.SetInjector("mesh", "1", cur, false)
	x.SetNamespace("apps", map[string]string{})
	a, b := inject(t, cur, pod("apps", "a", nil)), pod("apps", "b", nil)
	for _, p := range []*corev1.Pod{a, b} {
		x.Upsert(x.Record(p))
	}
	before, _ := x.Counts("mesh")
	held := x.Record(a.DeepCopy())
	if again := x.Record(a.DeepCopy()); again != held {
		t.Fatal("an unchanged pod got a new record")
	}
	changed := b.DeepCopy()
	changed.ResourceVersion = "2"
	changed.Spec.Containers[0].Image = "app:2"
	fresh := x.Record(changed)
	if old := x.Record(b.DeepCopy()); fresh == old {
		t.Fatal("a changed pod kept its old record")
	}
	replaced := a.DeepCopy()
	replaced.UID = "0b5c2f63-3c1e-4d4e-9a34-000000000001"
	if x.Record(replaced) == held {
		t.Fatal("a pod with the same name and another UID kept the old record")
	}
	ch := x.Replace([]*Pod{held, fresh})
	if got, _ := x.Counts("mesh"); got != before || !slices.Equal(ch, Changes{"mesh"}) {
		t.Fatalf("after the re-sync: counts %+v (before %+v), changes %v", got, before, ch)
	}
	if s := x.Stats(); s.Pods != 2 {
		t.Fatalf("%d pods indexed, want 2", s.Pods)
	}
}

// BenchmarkRecordUnchanged: a re-sync's transform of a pod the index
// holds unchanged (the held record handed back).
func BenchmarkRecordUnchanged(b *testing.B) {
	const n = 20000
	x := New()
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		pods[i] = realisticPod(i)
		pods[i].UID = types.UID(fmt.Sprintf("0b5c2f63-3c1e-4d4e-9a34-%012d", i))
		pods[i].ResourceVersion = fmt.Sprint(1000 + i)
		x.Upsert(FromPod(pods[i]))
	}
	b.ResetTimer()
	for i := range b.N {
		if x.Record(pods[i%n]) == nil {
			b.Fatal("no record")
		}
	}
}

// TestStateTable: every slot keeps its own state, its neighbour in the
// same byte untouched, across growth from an odd and an even size.
func TestStateTable(t *testing.T) {
	all := []state{none, current, outdated, missing, orphaned}
	for _, start := range []int{0, 1, 2, 7} {
		tb := newStateTable(start)
		want := make([]state, start)
		for i := range 11 {
			tb.grow()
			want = append(want, none)
			for j := range want {
				s := all[(i+j)%len(all)]
				tb.set(int32(j), s)
				want[j] = s
			}
			for j, w := range want {
				if got := tb.get(int32(j)); got != w {
					t.Fatalf("start %d, after %d grows: slot %d = %d, want %d", start, i+1, j, got, w)
				}
			}
			if tb.len() != len(want) {
				t.Fatalf("len %d, want %d", tb.len(), len(want))
			}
		}
		// Setting one slot leaves the other half of its byte alone.
		tb.set(0, orphaned)
		tb.set(1, current)
		tb.set(0, none)
		if tb.get(0) != none || tb.get(1) != current {
			t.Errorf("start %d: slots 0,1 = %d,%d, want none,current", start, tb.get(0), tb.get(1))
		}
	}
}

// TestListSlotTakenMidList: a listed pod deleted while a list is under
// way frees its slot; a pod indexed into that slot outside the list is
// not named by it and goes at End.
func TestListSlotTakenMidList(t *testing.T) {
	cur := testInjector(t, "mesh", "proxy:2", nil)
	x := New()
	x.SetInjector("mesh", "1", cur, false)
	x.SetNamespace("apps", map[string]string{})
	l := x.BeginList()
	l.Add(FromPod(pod("apps", "a", nil)))
	l.Add(FromPod(pod("apps", "b", nil)))
	x.Delete("apps", "a")
	x.Upsert(FromPod(pod("apps", "c", nil)))
	if ch := l.End(); !slices.Equal(ch, Changes{"mesh"}) {
		t.Fatalf("End reported %v, want [mesh]", ch)
	}
	if s := x.Stats(); s.Pods != 1 {
		t.Fatalf("%d pods indexed after the list, want 1 (b)", s.Pods)
	}
	if got, _ := x.Counts("mesh"); got.MatchedPods != 1 {
		t.Fatalf("counts after the list: %+v, want one matched pod", got)
	}
}
