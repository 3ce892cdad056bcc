// Package oversell inflates the cpu and memory allocatable of selected nodes
// by rewriting the nodes' own status writes in a mutating admission webhook.
//
// The engine (this file) is pure: it decides from the admitted object, the
// old object, the writer and the selected NodeOversell what the node's
// allocatable and bookkeeping annotations must be; target.go reads the
// operator's per-node decision (ratio within the NodeOversell's ceiling,
// exclusive CPUs) from the node and applies it only downwards. The handler (handler.go)
// is the thin HTTP shell around it; the store (store.go) keeps the
// NodeOversell objects the informer delivers (webhooks/configwatch).
//
// Kubernetes facts it rests on (v1.37):
//   - Mutating admission on nodes/status UPDATE (and PATCH, which is an
//     UPDATE to admission) sees the object after the patch is applied plus
//     the old object (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go).
//   - The node status strategy resets only spec, so a webhook on nodes/status
//     may change status and metadata.annotations
//     (pkg/registry/core/node/strategy.go, nodeStatusStrategy.PrepareForUpdate).
//   - The kubelet recomputes allocatable as capacity minus reservations and
//     patches nodes/status with a two-way merge from its informer copy
//     (pkg/kubelet/kubelet_node_status.go, tryUpdateNodeStatus), so a write
//     by system:node:<name> carries the real allocatable, except when its
//     copy is stale and already equal to what it computed.
//
// Cost: once a node is inflated, the kubelet's computed allocatable never
// equals the stored one, so it patches nodes/status every
// nodeStatusUpdateFrequency (10 s) instead of every nodeStatusReportFrequency
// (5 min), about 30 times more node writes (each a real etcd write, as it
// carries new heartbeat times). test/integration TestOversellHeartbeatsNoDrift
// measures it: 6 patches per minute per inflated node, 0 for a plain one. A
// ratio of exactly 1 publishes the real value and ends the extra writes.
// The handler cuts the etcd part of that cost: a patch that only restates
// raw allocatable and heartbeat times is answered so that the stored node
// is unchanged, and the API server writes nothing (hold.go), until the
// stored heartbeat is as old as the kubelet's report period.
//
// It must not import controllers, internal/ packages or the other
// server (webhooks/sidecar), nor anything that links a Kubernetes client:
// it uses api/v1alpha1, webhooks/serving and webhooks/jsonscan only
// (internal/importrules checks the whole dependency closure).
package oversell

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// WriterClass is who is writing the node status, as far as raw allocatable
// is concerned.
type WriterClass int

const (
	// WriterOther is any user whose allocatable is not trusted as real.
	WriterOther WriterClass = iota
	// writerKubelet is the node's own kubelet: user system:node:<node name>
	// in group system:nodes (the NodeRestriction identity).
	writerKubelet
	// writerTrusted is a user listed in the selected NodeOversell's
	// spec.trustedReporters or in the server's --trusted-reporter flag.
	writerTrusted
)

// String returns the metric label: "kubelet", "trusted" or "other".
func (w WriterClass) String() string {
	switch w {
	case writerKubelet:
		return "kubelet"
	case writerTrusted:
		return "trusted"
	}
	return "other"
}

// reportsRaw reports whether the writer's allocatable is the node's real one.
func (w WriterClass) reportsRaw() bool { return w != WriterOther }

const nodeUserPrefix = "system:node:"

// classifyWriter classifies the request user for node nodeName. trusted
// reports whether a user name is a configured trusted reporter (may be nil).
func classifyWriter(nodeName, user string, groups []string, trusted func(string) bool) WriterClass {
	if len(user) == len(nodeUserPrefix)+len(nodeName) && user[:len(nodeUserPrefix)] == nodeUserPrefix && user[len(nodeUserPrefix):] == nodeName {
		for _, g := range groups {
			if g == "system:nodes" {
				return writerKubelet
			}
		}
	}
	if trusted != nil && trusted(user) {
		return writerTrusted
	}
	return WriterOther
}

// NodeState is the part of a Node the engine reads. Quantities stay strings
// as they appear in the JSON; the engine parses only cpu and memory.
type NodeState struct {
	Labels      map[string]string
	Annotations map[string]string
	Capacity    map[string]string
	Allocatable map[string]string
}

// Input is everything a decision depends on.
type Input struct {
	Writer WriterClass
	// Object is the node as it will be stored (after the writer's patch).
	Object NodeState
	// Old is the stored node before the write; nil only if the API server
	// sent no oldObject.
	Old *NodeState
	// Policy is the NodeOversell that selects the node, nil if none does.
	Policy *Policy
}

// Reason explains a decision; it is a metric label, so the set is closed.
type Reason string

// Reasons of Decide.
const (
	reasonKubeletReport   Reason = "kubelet-report"   // raw taken from the node's kubelet
	reasonTrustedReport   Reason = "trusted-report"   // raw taken from a trusted reporter
	reasonStaleReport     Reason = "stale-report"     // kubelet patch left the published value alone; raw kept from the annotation
	reasonAnnotation      Reason = "annotation"       // other writer; raw from the annotation
	reasonAdopted         Reason = "adopted"          // other writer, node never amplified: its value is raw
	reasonDeselected      Reason = "deselected"       // no NodeOversell selects the node any more: raw restored
	reasonNotSelected     Reason = "not-selected"     // no NodeOversell, nothing to undo
	reasonRawUnknown      Reason = "raw-unknown"      // other writer; recorded raw missing, corrupt or implausible, or an implausible value to adopt
	reasonInvalidQuantity Reason = "invalid-quantity" // allocatable cpu or memory does not parse
	reasonNoAllocatable   Reason = "no-allocatable"   // the write has no cpu or memory allocatable: nothing to amplify or record
)

// Decision is the outcome of Decide. When Apply is false the write must be
// admitted unchanged. When Apply is true, Allocatable and Annotations give
// the final values; BuildPatch turns them into JSON patch operations.
type Decision struct {
	Apply  bool
	Reason Reason
	// Restore is true when the node's annotations are removed and its raw
	// allocatable published (deselection).
	Restore bool
	// Present marks the resources the node's allocatable has.
	Present [numResources]bool
	// Raw, Effective and Ratio per resource, valid where Present.
	Raw       [numResources]resource.Quantity
	Effective [numResources]resource.Quantity
	Ratio     [numResources]Ratio
	// Annotations are the final values of RawAllocatableKey, RatiosKey and
	// AppliedByKey, in annotationKeys order; "" means absent.
	Annotations [3]string
	// UntrustedAllocatableWrite is true when a non-reporting writer sent a
	// cpu or memory allocatable different from the stored one: the writes
	// that compound in implementations that multiply whatever arrives.
	UntrustedAllocatableWrite bool
}

// annotationKeys are the keys the engine owns, in Decision.Annotations order.
var annotationKeys = [3]string{
	v1alpha1.OversellRawAllocatableKey,
	v1alpha1.OversellRatiosKey,
	v1alpha1.OversellAppliedByKey,
}

// resourceJSON is the shape of the raw-allocatable and ratios annotations.
// The ratios annotation also records the exclusive CPUs subtracted before
// amplifying cpu (AmplifyExclusive), so the published value can be
// recomputed from the annotations alone.
type resourceJSON struct {
	CPU          string `json:"cpu,omitempty"`
	Memory       string `json:"memory,omitempty"`
	ExclusiveCPU string `json:"exclusiveCPU,omitempty"`
}

func (r *resourceJSON) get(res Resource) string {
	if res == CPU {
		return r.CPU
	}
	return r.Memory
}

func (r *resourceJSON) set(res Resource, v string) {
	if res == CPU {
		r.CPU = v
	} else {
		r.Memory = v
	}
}

// stored is what the engine's annotations on the old object say.
type stored struct {
	present bool // any engine annotation exists: the node was amplified
	raw     [numResources]resource.Quantity
	rawOK   [numResources]bool // parsed and plausible for the capacity
	parsed  [numResources]bool // parsed
	ratio   [numResources]Ratio
	// exclusive is the recorded exclusive cpu (zero when none).
	exclusive resource.Quantity
}

func hasEngineAnnotations(ann map[string]string) bool {
	for _, k := range annotationKeys {
		if _, ok := ann[k]; ok {
			return true
		}
	}
	return false
}

// readStored parses the engine annotations. Corrupt JSON or quantities leave
// rawOK false for the affected resources; a corrupt ratio leaves it unset.
// A raw annotation holding neither cpu nor memory (the "{}" once recorded
// for writes without allocatable) amplified nothing: all count as absent.
func readStored(ann map[string]string) stored {
	var s stored
	if !hasEngineAnnotations(ann) {
		return s
	}
	var raw resourceJSON
	if v, ok := ann[v1alpha1.OversellRawAllocatableKey]; ok && json.Unmarshal([]byte(v), &raw) == nil {
		if raw.CPU == "" && raw.Memory == "" {
			return s
		}
		for r := Resource(0); r < numResources; r++ {
			if q, err := parseQuantity(raw.get(r)); err == nil && raw.get(r) != "" {
				s.raw[r], s.rawOK[r], s.parsed[r] = q, true, true
			}
		}
	}
	s.present = true
	var ratios resourceJSON
	if v, ok := ann[v1alpha1.OversellRatiosKey]; ok && json.Unmarshal([]byte(v), &ratios) == nil {
		for r := Resource(0); r < numResources; r++ {
			if x, err := ParseRatio(ratios.get(r)); err == nil {
				s.ratio[r] = x
			}
		}
		if q, err := parseQuantity(ratios.ExclusiveCPU); err == nil && ratios.ExclusiveCPU != "" {
			s.exclusive = q
		}
	}
	return s
}

// capacityOf returns the node's parsed capacity for r, nil when absent or
// invalid.
func capacityOf(caps map[string]string, r Resource) *resource.Quantity {
	if q, ok := optQuantity(caps, resourceNames[r]); ok {
		return &q
	}
	return nil
}

// plausibleRaw reports whether raw can be the real allocatable of r on a
// node with this capacity: at most capacity and, unless capacity is zero,
// not zero (negatives never parse). Without a capacity nothing bounds it.
// Only such a value may be taken as raw from anyone but a reporting writer:
// whoever can annotate a node could otherwise publish any allocatable.
func plausibleRaw(raw resource.Quantity, capacity *resource.Quantity) bool {
	if capacity == nil || raw.Cmp(*capacity) > 0 {
		return false
	}
	return raw.Sign() > 0 || capacity.Sign() == 0
}

// PlausibleRaw is the engine's check of a recorded raw allocatable, for
// other writers of node status (the operator's restore): raw is trusted
// only if 0 < raw ≤ capacity (raw may be 0 when capacity is 0); a nil
// capacity (absent or unparseable) trusts nothing.
func PlausibleRaw(raw resource.Quantity, capacity *resource.Quantity) bool {
	return plausibleRaw(raw, capacity)
}

// optQuantity parses m[key]; ok is false when absent or invalid.
func optQuantity(m map[string]string, key string) (resource.Quantity, bool) {
	s, found := m[key]
	if !found {
		return resource.Quantity{}, false
	}
	q, err := parseQuantity(s)
	return q, err == nil
}

// Decide computes the node's allocatable and annotations for one status
// write. It never compounds: the published value is always raw × ratio,
// where raw comes from the writer only if it reports real values (the node's
// kubelet or a trusted reporter) and otherwise from the raw-allocatable
// annotation recorded on the stored object, and only if plausible for the
// node's capacity (see plausibleRaw); it is never above capacity × ratio.
//
// The one exception for reporting writers: when the incoming value equals
// the amplification of the raw recorded on the admitted object, it is no
// report: the kubelet's patch (computed from its possibly stale informer
// copy) did not carry allocatable, or an earlier hookwright webhook of the
// same request already amplified the report. The recorded raw is kept.
// Misreading a real value that happens to equal the amplified one errs on
// the safe side (the node is under- rather than over-committed).
//
// Decide is idempotent under chaining: feeding its output (the object with
// the patch applied) to Decide again, with the same writer and old object,
// with this or any other policy, keeps the same raw. So N webhook servers
// called in series, whatever snapshot each holds, record the writer's raw
// exactly and publish raw × the last acting server's ratio.
func Decide(in Input) Decision {
	var d Decision
	obj := in.Object
	// Several NodeOversells may select one node, and the API server then
	// calls one hookwright webhook after another, each seeing the object as
	// the previous one left it (mutating webhooks run in series, see
	// chain.go). Where the annotations are read from decides whether a later
	// webhook takes an earlier one's output for the writer's.
	var st stored
	if in.Writer.reportsRaw() {
		// A reporting writer does not write the engine annotations (the
		// kubelet's patch is a diff of status and labels only), so those on
		// the admitted object are the stored ones, or the ones an earlier
		// hookwright webhook of this request recorded with the report it
		// took as raw. Their amplification is then not a report (staleReport).
		// A reporting writer that forges them gains nothing: its allocatable
		// is taken as raw anyway.
		st = readStored(in.Object.Annotations)
	} else {
		// Read from the stored object, so a writer cannot replace a recorded
		// raw value. Only when the stored object has none are the written
		// ones used: an earlier webhook of this request recorded them while
		// adopting a value, or a full write from an old copy brings back an
		// amplified value with its bookkeeping, and adopting that value as
		// raw would compound. Injecting them grants nothing adoption does not.
		if in.Old != nil {
			st = readStored(in.Old.Annotations)
		}
		if !st.present {
			st = readStored(in.Object.Annotations)
		}
	}
	var caps [numResources]*resource.Quantity
	for r := Resource(0); r < numResources; r++ {
		caps[r] = capacityOf(obj.Capacity, r)
		if st.rawOK[r] && !plausibleRaw(st.raw[r], caps[r]) {
			st.rawOK[r] = false
		}
	}

	var incoming [numResources]resource.Quantity
	for r := Resource(0); r < numResources; r++ {
		s, found := obj.Allocatable[resourceNames[r]]
		if !found {
			continue
		}
		q, err := parseQuantity(s)
		if err != nil {
			d.Reason = reasonInvalidQuantity
			return d
		}
		d.Present[r], incoming[r] = true, q
		if in.Old != nil && !in.Writer.reportsRaw() {
			if old, ok := optQuantity(in.Old.Allocatable, resourceNames[r]); !ok || old.Cmp(q) != 0 {
				d.UntrustedAllocatableWrite = true
			}
		}
	}
	if !d.Present[CPU] && !d.Present[Memory] {
		// Recording "{}" would mark the node amplified with no raw, and
		// every later non-reporting write would be skipped as raw-unknown.
		return Decision{Reason: reasonNoAllocatable}
	}

	// Raw per resource.
	for r := Resource(0); r < numResources; r++ {
		if !d.Present[r] {
			continue
		}
		switch {
		case in.Writer.reportsRaw():
			d.Raw[r] = incoming[r]
			if d.Reason == "" {
				d.Reason = reasonKubeletReport
				if in.Writer == writerTrusted {
					d.Reason = reasonTrustedReport
				}
			}
			if staleReport(st, caps[r], r, incoming[r]) {
				d.Raw[r] = st.raw[r]
				d.Reason = reasonStaleReport
			}
		case st.rawOK[r]:
			d.Raw[r] = st.raw[r]
			d.Reason = reasonAnnotation
		case !st.present && plausibleRaw(incoming[r], caps[r]):
			d.Raw[r] = incoming[r]
			d.Reason = reasonAdopted
		default:
			d.Reason = reasonRawUnknown
			return Decision{Reason: reasonRawUnknown, UntrustedAllocatableWrite: d.UntrustedAllocatableWrite}
		}
	}

	if in.Policy == nil {
		if !st.present {
			return Decision{Reason: reasonNotSelected, UntrustedAllocatableWrite: d.UntrustedAllocatableWrite}
		}
		d.Apply, d.Restore, d.Reason = true, true, reasonDeselected
		for r := Resource(0); r < numResources; r++ {
			if d.Present[r] {
				d.Effective[r] = Amplify(r, d.Raw[r], caps[r], Ratio{})
			}
		}
		return d
	}

	var rawJSON, ratioJSON resourceJSON
	// The operator's decision for this node (target.go): read from the
	// admitted object, since the operator writes it in the same patch; it
	// can only lower the node within the policy's bounds.
	tgt := readTarget(obj.Annotations, in.Policy.Name)
	for r := Resource(0); r < numResources; r++ {
		if !d.Present[r] {
			continue
		}
		ratio := in.Policy.ratioFor(r, tgt)
		d.Effective[r] = AmplifyExclusive(r, d.Raw[r], caps[r], ratio, tgt.exclusive)
		d.Ratio[r] = ratio
		rawJSON.set(r, d.Raw[r].String())
		if ratio.IsSet() {
			ratioJSON.set(r, ratio.String())
		}
		if r == CPU && tgt.hasExcl && tgt.exclusive.Sign() > 0 {
			ratioJSON.ExclusiveCPU = tgt.exclusive.String()
		}
	}
	d.Apply = true
	d.Annotations[0] = mustJSON(&rawJSON)
	d.Annotations[1] = mustJSON(&ratioJSON)
	d.Annotations[2] = in.Policy.Name
	return d
}

// staleReport reports whether a reporting writer's value for r is the
// amplification of the raw recorded on the admitted object rather than a
// report: the published value the kubelet's patch (from its possibly stale
// informer copy) did not touch, or the output of an earlier hookwright
// webhook in the same admission chain. The recorded raw is then kept. It
// needs only a parsed raw, not a plausible one: the record came from this
// writer's own reports.
func staleReport(st stored, capacity *resource.Quantity, r Resource, incoming resource.Quantity) bool {
	// A ratio above 1 publishes more than a raw within capacity, so a value
	// at most the raw (the kubelet's usual report) is a report; this also
	// keeps Decide's steady state free of the multiplication.
	if !st.parsed[r] || !st.ratio[r].IsSet() || st.ratio[r].IsOne() || incoming.Cmp(st.raw[r]) <= 0 {
		return false
	}
	published := AmplifyExclusive(r, st.raw[r], capacity, st.ratio[r], st.exclusive)
	return published.Cmp(incoming) == 0 && published.Cmp(st.raw[r]) != 0
}

// mustJSON encodes the two-field struct; it cannot fail.
func mustJSON(v *resourceJSON) string {
	b, _ := json.Marshal(v)
	return string(b)
}
