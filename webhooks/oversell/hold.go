package oversell

import (
	"bytes"
	"strconv"
	"time"

	"github.com/hookwright/hookwright/webhooks/jsonscan"
)

// Holding a restatement.
//
// The kubelet computes its status patch against the node its informer
// holds, which carries the amplified allocatable, while its own status has
// the raw one: nodeStatusHasChanged is then always true and an amplified
// node is patched every nodeStatusUpdateFrequency (10 s) instead of every
// nodeStatusReportFrequency (5 min) (pkg/kubelet/kubelet_node_status.go,
// updateNodeStatus and nodeStatusHasChanged). Such a patch restates raw
// allocatable, which Decide amplifies back to the stored value, plus new
// heartbeat times; nothing else changes.
//
// For such a write the handler can answer with a patch that puts the
// stored allocatable strings and the stored lastHeartbeatTime of every
// condition back, so the object to store equals the stored one. The API
// server then reverts the managedFields timestamps its field manager
// bumped (fieldmanager.IgnoreManagedFieldsTimestampsTransformer, called
// from the generic registry's Store.Update) and, the encoded object being
// byte-equal, skips the etcd write (storage/etcd3 store.GuaranteedUpdate);
// the kubelet gets the stored object back with its resourceVersion.
//
// The guard: a write is held only while every stored lastHeartbeatTime is
// younger than the handler's MaxHeartbeatAge (default 5 min, the kubelet's
// report period). A plain node's heartbeat is written at least that often,
// so holding never leaves node conditions staler than without
// amplification; the node's Lease (renewed every 10 s) is untouched.

// member is one JSON member: its raw name and raw value, slices of the body.
type member struct {
	parent byte // 't' top level, 'm' metadata, 's' status, 'f'/'F' managedFields
	key    []byte
	val    []byte
}

// condScan is one node condition: its lastHeartbeatTime value (raw JSON,
// nil when absent) and its other members in order.
type condScan struct {
	heartbeat []byte
	rest      []member
}

// nodeScan is what parseNode records of a node for the hold check.
type nodeScan struct {
	// ok is false when conditions had an unexpected shape.
	ok bool
	// residue is every member except status.allocatable and
	// status.conditions, in order, with managedFields entries' time left
	// out ('F' starts an entry, 'f' is one of its members).
	residue []member
	conds   []condScan
}

func (s *nodeScan) keep(parent byte, key, val []byte) {
	s.residue = append(s.residue, member{parent: parent, key: key, val: val})
}

func sameMembers(a, b []member) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].parent != b[i].parent || !bytes.Equal(a[i].key, b[i].key) || !bytes.Equal(a[i].val, b[i].val) {
			return false
		}
	}
	return true
}

// appendHoldPatch appends the JSON patch that turns obj into old when the
// write restates what old stores: d (applied, not a restore) keeps old's
// cpu and memory allocatable and the engine annotations as obj has them,
// every other allocatable and every other member equal old's byte for
// byte (managedFields apart from their time: a change of the fields a
// manager owns is written whatever the webhook answers), and the
// conditions differ from old's only in lastHeartbeatTime.
// It reports false, leaving dst unchanged, when the write is anything else,
// when obj already equals old, or when a stored heartbeat is maxAge old or
// older at now (or does not parse): that write goes through.
func appendHoldPatch(dst []byte, obj, old *nodeJSON, d *Decision, now time.Time, maxAge time.Duration) ([]byte, bool) {
	if maxAge <= 0 || !d.Apply || d.Restore || !obj.scan.ok || !old.scan.ok {
		return dst, false
	}
	if !sameMembers(obj.scan.residue, old.scan.residue) || len(obj.scan.conds) != len(old.scan.conds) {
		return dst, false
	}
	for i, k := range annotationKeys {
		if cur, found := obj.Metadata.Annotations[k]; cur != d.Annotations[i] || found != (d.Annotations[i] != "") {
			return dst, false
		}
	}
	oa, na := old.Status.Allocatable, obj.Status.Allocatable
	if len(oa) != len(na) {
		return dst, false
	}
	for k, v := range na {
		ov, ok := oa[k]
		if !ok {
			return dst, false
		}
		if r, amplified := resourceOf(k); amplified && d.Present[r] {
			q, err := parseQuantity(ov)
			if err != nil || q.Cmp(d.Effective[r]) != 0 {
				return dst, false
			}
		} else if v != ov {
			return dst, false
		}
	}
	for i := range obj.scan.conds {
		oc, nc := &old.scan.conds[i], &obj.scan.conds[i]
		if !sameMembers(nc.rest, oc.rest) || (oc.heartbeat == nil) != (nc.heartbeat == nil) {
			return dst, false
		}
		if oc.heartbeat == nil {
			continue
		}
		s, _, err := jsonscan.ReadString(oc.heartbeat, 0, "lastHeartbeatTime")
		if err != nil {
			return dst, false
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil || now.Sub(t) >= maxAge {
			return dst, false
		}
	}

	start := len(dst)
	dst = append(dst, '[')
	n := 0
	sep := func() {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
	}
	for r := Resource(0); r < numResources; r++ {
		k := resourceNames[r]
		if !d.Present[r] || na[k] == oa[k] {
			continue
		}
		sep()
		dst = append(dst, `{"op":"replace","path":"/status/allocatable/`...)
		dst = append(dst, k...)
		dst = append(dst, `","value":`...)
		dst = jsonscan.AppendString(dst, oa[k])
		dst = append(dst, '}')
	}
	for i := range obj.scan.conds {
		oc, nc := &old.scan.conds[i], &obj.scan.conds[i]
		if oc.heartbeat == nil || bytes.Equal(oc.heartbeat, nc.heartbeat) {
			continue
		}
		sep()
		dst = append(dst, `{"op":"replace","path":"/status/conditions/`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `/lastHeartbeatTime","value":`...)
		dst = append(dst, oc.heartbeat...)
		dst = append(dst, '}')
	}
	if n == 0 {
		return dst[:start], false
	}
	return append(dst, ']'), true
}

// resourceOf maps an allocatable key to the Resource the engine amplifies.
func resourceOf(key string) (Resource, bool) {
	for r := Resource(0); r < numResources; r++ {
		if resourceNames[r] == key {
			return r, true
		}
	}
	return 0, false
}
