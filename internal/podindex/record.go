package podindex

import (
	"encoding/binary"
	"encoding/hex"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/internal/usageratio"
)

// annotationPrefix keeps the injector's own annotations (inject, status,
// templates, native-sidecar, rollout): with the mirror pod annotation
// (v1alpha1.Spared), the only ones Decide, Classify and the rollout read.
const annotationPrefix = "sidecar.hookwright.io/"

// keptAnnotation tells whether the record keeps annotation k.
func keptAnnotation(k string) bool {
	return strings.HasPrefix(k, annotationPrefix) || k == v1alpha1.MirrorPodAnnotation
}

// str is one interned string: a unique.Handle (Go's runtime intern table,
// shared by the whole process and weak, so a string no pod uses any more
// is collected). The zero str is "".
type str struct{ h unique.Handle[string] }

func intern(s string) str {
	if s == "" {
		return str{}
	}
	return str{unique.Make(s)}
}

func (s str) String() string {
	if s == (str{}) {
		return ""
	}
	return s.h.Value()
}

// Pod is what the index keeps of one pod: 80 bytes plus its name. What
// the pod's template decides (labels, our annotations, containers, owner,
// priority class, hostNetwork, requests) is one interned shape shared by
// every replica. The UID is kept as its 16 bytes and the resourceVersion
// as a number when they have the API server's usual form (a lowercase
// UUID, a decimal etcd revision); any other form is kept as written in a
// side record (oddIDs). It is also a runtime.Object so that a paged list
// can carry records instead of pods. A record is never modified once
// built: the index keeps the pointer FromPod returned.
type Pod struct {
	Namespace str
	Name      string
	uid       [16]byte
	rv        uint64 // the resourceVersion + 1; 0 when empty
	Node      str
	shape     unique.Handle[shape]
	Created   int64 // unix seconds
	phase     phase
	Ready     bool
	Deleting  bool
	// odd tells that the UID or resourceVersion is in the side record.
	odd bool
}

// shape is what a pod's metadata and spec give that the replicas of one
// template share, interned: the records of a ReplicaSet hold one.
type shape struct {
	priorityClass str // spec.priorityClassName (v1alpha1.Spared)
	// labels, annotations (ours only), containers and owner (the
	// controller reference) are encoded sets (see encode), interned.
	labels, annotations, containers, owner str
	// usageratio.PodRequests in milli-units, and the cpu the static CPU
	// manager would pin.
	cpuMilli, memoryMilli, exclusiveCPUMilli int64
	memoryFormat                             format // the memory request's, as written
	hostNetwork, guaranteed                  bool
}

// shapeOf is p's shape; a zero Pod has the zero shape.
func (p *Pod) shapeOf() shape {
	if p.shape == (unique.Handle[shape]{}) {
		return shape{}
	}
	return p.shape.Value()
}

// PriorityClass is spec.priorityClassName (v1alpha1.Spared).
func (p *Pod) PriorityClass() string { return p.shapeOf().priorityClass.String() }

// HostNetwork is spec.hostNetwork.
func (p *Pod) HostNetwork() bool { return p.shapeOf().hostNetwork }

// Guaranteed reports whether the pod is in the Guaranteed QoS class as
// the static CPU manager reads it (exclusiveCPU).
func (p *Pod) Guaranteed() bool { return p.shapeOf().guaranteed }

// CPUMilli is the pod's cpu request (usageratio.PodRequests) in
// millicores.
func (p *Pod) CPUMilli() int64 { return p.shapeOf().cpuMilli }

// MemoryMilli is the pod's memory request (usageratio.PodRequests) in
// thousandths of a byte.
func (p *Pod) MemoryMilli() int64 { return p.shapeOf().memoryMilli }

// ExclusiveCPUMilli is the cpu, in millicores, the static CPU manager
// would pin to the pod's containers.
func (p *Pod) ExclusiveCPUMilli() int64 { return p.shapeOf().exclusiveCPUMilli }

// memoryFormat is the format of the memory request as written.
func (p *Pod) memoryFormat() resource.Format { return formats[p.shapeOf().memoryFormat] }

// phase is status.phase in one byte; a phase Kubernetes does not define
// is kept as Unknown.
type phase uint8

var phases = []corev1.PodPhase{"", corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown}

// format is a resource.Format in one byte (the three formats a
// Quantity has).
type format uint8

var formats = []resource.Format{"", resource.DecimalExponent, resource.BinarySI, resource.DecimalSI}

// UID is metadata.uid.
func (p *Pod) UID() types.UID {
	if o := p.ids(); o != nil && o.uid != "" {
		return o.uid
	}
	if p.uid == [16]byte{} {
		return ""
	}
	return types.UID(formatUUID(p.uid))
}

// ResourceVersion is metadata.resourceVersion.
func (p *Pod) ResourceVersion() string {
	if o := p.ids(); o != nil && o.rv != "" {
		return o.rv
	}
	if p.rv == 0 {
		return ""
	}
	return strconv.FormatUint(p.rv-1, 10)
}

// Phase is status.phase (a phase Kubernetes does not define reads as
// Unknown).
func (p *Pod) Phase() corev1.PodPhase { return phases[p.phase] }

// packUUID packs a lowercase canonical UUID (what the API server writes,
// k8s.io/apimachinery/pkg/util/uuid) into its 16 bytes; ok is false for
// any other string, the all-zero UUID included (the zero value means "").
func packUUID(s string) (out [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return out, false
	}
	var b [32]byte
	copy(b[:], s[:8])
	copy(b[8:], s[9:13])
	copy(b[12:], s[14:18])
	copy(b[16:], s[19:23])
	copy(b[20:], s[24:])
	if _, err := hex.Decode(out[:], b[:]); err != nil || out == [16]byte{} {
		return [16]byte{}, false
	}
	return out, formatUUID(out) == s
}

func formatUUID(u [16]byte) string {
	b := uuidText(u)
	return string(b[:])
}

// uuidText is u in the 8-4-4-4-12 lowercase form.
func uuidText(u [16]byte) [36]byte {
	var b [36]byte
	hex.Encode(b[:8], u[:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return b
}

// hasIDs reports whether UID() and ResourceVersion() are uid and rv,
// without making either string: a re-sync asks it of every pod.
func (p *Pod) hasIDs(uid types.UID, rv string) bool {
	o := p.ids()
	return p.hasUID(o, uid) && p.hasRV(o, rv)
}

func (p *Pod) hasUID(o *oddIDs, uid types.UID) bool {
	if o != nil && o.uid != "" {
		return o.uid == uid
	}
	if p.uid == [16]byte{} {
		return uid == ""
	}
	b := uuidText(p.uid)
	return string(b[:]) == string(uid)
}

func (p *Pod) hasRV(o *oddIDs, rv string) bool {
	if o != nil && o.rv != "" {
		return o.rv == rv
	}
	if p.rv == 0 {
		return rv == ""
	}
	var b [20]byte
	return string(strconv.AppendUint(b[:0], p.rv-1, 10)) == rv
}

// packRV packs a decimal resourceVersion without leading zeros (etcd's
// revision, k8s.io/apiserver/pkg/storage/etcd3) as its value + 1.
func packRV(s string) (uint64, bool) {
	if s == "" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == math.MaxUint64 || strconv.FormatUint(v, 10) != s {
		return 0, false
	}
	return v + 1, true
}

func (p *Pod) setIDs(uid types.UID, rv string) {
	var okU, okR bool
	if uid == "" {
		okU = true
	} else {
		p.uid, okU = packUUID(string(uid))
	}
	p.rv, okR = packRV(rv)
	if !okU || !okR {
		o := &oddIDs{}
		if !okU {
			o.uid = uid
		}
		if !okR {
			o.rv = rv
		}
		p.setOdd(o)
	}
}

// GetObjectKind and DeepCopyObject make a Pod a runtime.Object (a paged
// list's item); a Pod is immutable once built, so the copy is itself.
func (p *Pod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject returns p: records are never modified after Compact.
func (p *Pod) DeepCopyObject() runtime.Object { return p }

// Key is namespace/name, the reflector's key.
func (p *Pod) Key() string { return p.Namespace.String() + "/" + p.Name }

// Running reports whether the pod holds resources on its node: bound and
// not finished.
func (p *Pod) Running() bool {
	return p.Node != (str{}) && !p.Finished()
}

// Finished reports whether the pod succeeded or failed.
func (p *Pod) Finished() bool {
	return p.phase == succeeded || p.phase == failed
}

var succeeded, failed = phaseOf(corev1.PodSucceeded), phaseOf(corev1.PodFailed)

func phaseOf(ph corev1.PodPhase) phase {
	if i := slices.Index(phases, ph); i >= 0 {
		return phase(i)
	}
	return phaseOf(corev1.PodUnknown)
}

func formatOf(f resource.Format) format {
	return format(max(0, slices.Index(formats, f)))
}

// Labels are a decoded copy of the pod's labels.
func (p *Pod) Labels() map[string]string { return decodeMap(p.shapeOf().labels.String()) }

// Annotations are a decoded copy of the pod's sidecar.hookwright.io/
// annotations and mirror pod annotation (the only ones kept).
func (p *Pod) Annotations() map[string]string { return decodeMap(p.shapeOf().annotations.String()) }

// FromPod is the record of pod.
func FromPod(pod *corev1.Pod) *Pod {
	p := &Pod{
		Namespace: intern(pod.Namespace), Name: pod.Name, Node: intern(pod.Spec.NodeName), Created: pod.CreationTimestamp.Unix(),
		phase: phaseOf(pod.Status.Phase), Ready: fleet.PodReady(pod), Deleting: pod.DeletionTimestamp != nil,
		shape: unique.Make(shapeOfPod(pod)),
	}
	p.setIDs(pod.UID, pod.ResourceVersion)
	return p
}

// shapeOfPod is what pod's metadata and spec give the record.
func shapeOfPod(pod *corev1.Pod) shape {
	s := shape{
		priorityClass: intern(pod.Spec.PriorityClassName), hostNetwork: pod.Spec.HostNetwork,
		labels: intern(encodeMap(pod.Labels, nil)), annotations: intern(encodeMap(pod.Annotations, keptAnnotation)),
	}
	if ref := metav1.GetControllerOf(pod); ref != nil {
		s.owner = intern(encodeList([]string{ref.APIVersion, ref.Kind, ref.Name, string(ref.UID)}))
	}
	var cs []string
	for _, c := range pod.Spec.InitContainers {
		kind := "i"
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			kind = "s"
		}
		cs = append(cs, kind, c.Name, c.Image)
	}
	for _, c := range pod.Spec.Containers {
		cs = append(cs, "c", c.Name, c.Image)
	}
	s.containers = intern(encodeList(cs))
	req := usageratio.PodRequests(pod)
	if q, ok := req[corev1.ResourceCPU]; ok {
		s.cpuMilli = q.MilliValue()
	}
	if q, ok := req[corev1.ResourceMemory]; ok {
		s.memoryMilli, s.memoryFormat = q.MilliValue(), formatOf(q.Format)
	}
	s.guaranteed, s.exclusiveCPUMilli = exclusiveCPU(pod)
	return s
}

// exclusiveCPU is the cpu the static CPU manager gives pod exclusively
// (pkg/kubelet/cm/cpumanager/policy_static.go, guaranteedCPUs): in a
// Guaranteed pod, each regular or restartable init container whose cpu
// request is a whole number of CPUs.
func exclusiveCPU(pod *corev1.Pod) (guaranteed bool, milli int64) {
	all := append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
	if len(all) == 0 {
		return false, 0
	}
	for _, c := range all {
		for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			lim, ok := c.Resources.Limits[k]
			if !ok {
				return false, 0
			}
			if req, ok := c.Resources.Requests[k]; ok && req.Cmp(lim) != 0 {
				return false, 0
			}
		}
	}
	add := func(c corev1.Container) {
		q := c.Resources.Requests[corev1.ResourceCPU]
		if q.Sign() > 0 && q.MilliValue()%1000 == 0 {
			milli += q.MilliValue()
		}
	}
	for _, c := range pod.Spec.Containers {
		add(c)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	return true, milli
}

// View is a transient corev1.Pod with what the record keeps: namespace,
// name, UID, resourceVersion, labels, our annotations and the mirror pod
// annotation, the controller reference, creation and deletion (a marker
// time), spec.hostNetwork, spec.priorityClassName, spec.nodeName, container names and images (init containers with their
// restartPolicy), status.phase and the Ready condition. It is what
// fleet.Classify, sidecar.Decide and the rollout's selection read; it is
// built for one decision and dropped.
func (p *Pod) View() *corev1.Pod {
	s := p.shapeOf()
	v := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.Namespace.String(), Name: p.Name, UID: p.UID(), ResourceVersion: p.ResourceVersion(),
			Labels: decodeMap(s.labels.String()), Annotations: decodeMap(s.annotations.String()), CreationTimestamp: metav1.Unix(p.Created, 0),
		},
		Spec:   corev1.PodSpec{NodeName: p.Node.String(), HostNetwork: s.hostNetwork, PriorityClassName: s.priorityClass.String()},
		Status: corev1.PodStatus{Phase: p.Phase()},
	}
	if p.Deleting {
		v.DeletionTimestamp = &metav1.Time{Time: time.Unix(p.Created, 0)}
	}
	if o := decodeList(s.owner.String()); len(o) == 4 {
		yes := true
		v.OwnerReferences = []metav1.OwnerReference{{APIVersion: o[0], Kind: o[1], Name: o[2], UID: types.UID(o[3]), Controller: &yes}}
	}
	cs := decodeList(s.containers.String())
	for i := 0; i+2 < len(cs); i += 3 {
		c := corev1.Container{Name: cs[i+1], Image: cs[i+2]}
		switch cs[i] {
		case "c":
			v.Spec.Containers = append(v.Spec.Containers, c)
		case "s":
			always := corev1.ContainerRestartPolicyAlways
			c.RestartPolicy = &always
			fallthrough
		default:
			v.Spec.InitContainers = append(v.Spec.InitContainers, c)
		}
	}
	st := corev1.ConditionFalse
	if p.Ready {
		st = corev1.ConditionTrue
	}
	v.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return v
}

// Requests are the record's requests as quantities (cpu, memory).
func (p *Pod) Requests() corev1.ResourceList {
	s := p.shapeOf()
	out := corev1.ResourceList{}
	if s.cpuMilli != 0 {
		out[corev1.ResourceCPU] = *resource.NewMilliQuantity(s.cpuMilli, resource.DecimalSI)
	}
	if s.memoryMilli != 0 {
		out[corev1.ResourceMemory] = memoryQuantity(s.memoryMilli, formats[s.memoryFormat])
	}
	return out
}

func memoryQuantity(milli int64, f resource.Format) resource.Quantity {
	if f == "" {
		f = resource.BinarySI
	}
	if milli%1000 == 0 {
		return *resource.NewQuantity(milli/1000, f)
	}
	return *resource.NewMilliQuantity(milli, f)
}

// size is the record's own bytes (struct, name and side record), for the
// index's size estimate; shapes and interned strings are shared and not
// counted.
func (p *Pod) size() int {
	n := recordSize + len(p.Name)
	if o := p.ids(); o != nil {
		n += oddOverhead + len(o.uid) + len(o.rv)
	}
	return n
}

// encodeMap encodes the entries of m whose key keep accepts (every one
// when keep is nil), sorted by key, each as two length-prefixed strings: a
// canonical string, so equal sets intern to one.
func encodeMap(m map[string]string, keep func(string) bool) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if keep == nil || keep(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	slices.Sort(keys)
	var b []byte
	for _, k := range keys {
		b = appendString(b, k)
		b = appendString(b, m[k])
	}
	return string(b)
}

func encodeList(l []string) string {
	var b []byte
	for _, s := range l {
		b = appendString(b, s)
	}
	return string(b)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeList undoes encodeList; a malformed string (never produced here)
// decodes as far as it goes.
func decodeList(s string) []string {
	var out []string
	for len(s) > 0 {
		n, w := binary.Uvarint([]byte(s[:min(len(s), binary.MaxVarintLen64)]))
		if w <= 0 || uint64(len(s)-w) < n {
			return out
		}
		out = append(out, s[w:w+int(n)])
		s = s[w+int(n):]
	}
	return out
}

func decodeMap(s string) map[string]string {
	l := decodeList(s)
	m := make(map[string]string, len(l)/2)
	for i := 0; i+1 < len(l); i += 2 {
		m[l[i]] = l[i+1]
	}
	return m
}

// sameMap reports whether two maps are equal (for the namespaces' labels).
func sameMap(a, b map[string]string) bool { return maps.Equal(a, b) }
