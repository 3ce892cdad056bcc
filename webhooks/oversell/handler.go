package oversell

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/hookwright/hookwright/webhooks/jsonscan"
	"github.com/hookwright/hookwright/webhooks/serving"
)

// maxBodyBytes is the largest AdmissionReview accepted, in bytes. The API
// server caps objects at about 1.5 MiB and a review carries two of them.
const maxBodyBytes = serving.DefaultMaxBody

// Outcome labels of hookwright_oversell_mutations_total.
const (
	outcomePatched   = "patched"   // a JSON patch was returned
	outcomeUnchanged = "unchanged" // decided; the stored values are already right
	outcomeHeld      = "held"      // a kubelet restatement answered so the stored node stays unchanged (hold.go)
	outcomeSkipped   = "skipped"   // no safe decision; admitted unchanged with a warning
	outcomeIgnored   = "ignored"   // not an UPDATE of nodes/status; admitted unchanged with a warning
	outcomeError     = "error"     // internal problem; admitted unchanged with a warning
)

// handler-level reasons, next to the engine's reason values.
const (
	reasonNotSynced     Reason = "not-synced"
	reasonNotNodeStatus Reason = "not-node-status"
	reasonDecode        Reason = "decode-error"
	reasonPanic         Reason = "panic"
)

// bodyReasons are the mutations reasons of requests the skeleton refused:
// a body that is too slow or finds the server busy is not malformed; every
// other refusal is.
var bodyReasons = map[string]string{
	serving.ReasonTimeout: "body-timeout",
	serving.ReasonBusy:    "busy",
}

// SnapshotSource yields the configuration snapshot for one review.
type SnapshotSource interface {
	snapshot() *Snapshot
}

// Handler serves AdmissionReview v1 for UPDATE of nodes/status. It is a
// plain http.Handler so it can decode only the fields it needs (name,
// labels, annotations, status.capacity and status.allocatable of the object
// and old object), skipping images and conditions; register it on
// controller-runtime's webhook server with Register(path, h).
//
// Answers:
//   - 405, 415, 413 or 400 (text/plain) for a wrong method, a content type
//     other than application/json, a body over maxBodyBytes, or a body that
//     is not an AdmissionReview v1 with a request and uid; 408 for a body not
//     received within the request timeout and 429 while the in-flight body
//     budget is full (serving.Envelope).
//   - 200 allowed, no patch, one warning: for any other resource,
//     subresource or operation (a misconfigured webhook must not block
//     writes), before the NodeOversell cache has synced, when no safe
//     decision exists, and for every internal problem (a heartbeat is never
//     blocked; the problem is also logged and counted).
//   - 200 allowed with a JSONPatch on /status/allocatable/{cpu,memory} and
//     the oversell.hookwright.io/ annotations otherwise (sideEffects: None;
//     metrics are not side effects on the cluster).
//   - 200 allowed with a JSONPatch putting back the stored allocatable and
//     conditions' lastHeartbeatTime for a kubelet patch that only restates
//     raw allocatable and heartbeat times, while the stored heartbeats are
//     younger than MaxHeartbeatAge: the API server then stores nothing
//     (hold.go; counted with outcome "held").
type Handler struct {
	src     SnapshotSource
	metrics *Metrics
	log     logr.Logger
	// owner is the NodeOversell this server acts for ("" acts for all).
	owner string
	// Envelope bounds body size, read time and in-flight bytes; nil means
	// the process-wide Envelope with the default bounds (serving.Serve).
	Envelope *serving.Envelope
	// MaxHeartbeatAge bounds holding (hold.go): a reporting writer's
	// restatement is answered so that nothing is stored only while every
	// stored lastHeartbeatTime is younger than this. Zero or negative
	// never holds. NewHandler sets DefaultMaxHeartbeatAge.
	MaxHeartbeatAge time.Duration
	// now is the clock of the hold check; nil is time.Now.
	now func() time.Time
}

// DefaultMaxHeartbeatAge is the kubelet's nodeStatusReportFrequency
// default (5 min): a plain node's heartbeat is written at least that often.
const DefaultMaxHeartbeatAge = 5 * time.Minute

// NewHandler returns a handler reading configuration from src and
// recording into m (required; see NewMetrics).
func NewHandler(src SnapshotSource, m *Metrics, log logr.Logger) *Handler {
	return &Handler{src: src, metrics: m, log: log, MaxHeartbeatAge: DefaultMaxHeartbeatAge}
}

// ForNodeOversell makes h the server of NodeOversell name: it changes only
// nodes that name wins and passes other writes through (snapshot.Route).
// Without it h acts for whichever NodeOversell wins. It returns h.
func (h *Handler) ForNodeOversell(name string) *Handler {
	h.owner = name
	return h
}

// requestJSON is the subset of an admission.k8s.io/v1 AdmissionRequest the
// handler reads (see parseReview).
type requestJSON struct {
	UID      string `json:"uid"`
	Resource struct {
		Group    string `json:"group"`
		Resource string `json:"resource"`
	} `json:"resource"`
	SubResource string `json:"subResource"`
	Name        string `json:"name"`
	Operation   string `json:"operation"`
	UserInfo    struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"userInfo"`
	Object    nodeJSON  `json:"object"`
	OldObject *nodeJSON `json:"oldObject"`
	DryRun    bool      `json:"dryRun"`
}

type nodeJSON struct {
	Metadata struct {
		Name        string            `json:"name"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		Capacity    map[string]string `json:"capacity"`
		Allocatable map[string]string `json:"allocatable"`
	} `json:"status"`
	// scan is what parseNode records for the hold check (hold.go).
	scan nodeScan
}

func (n *nodeJSON) state() NodeState {
	return NodeState{
		Labels:      n.Metadata.Labels,
		Annotations: n.Metadata.Annotations,
		Capacity:    n.Status.Capacity,
		Allocatable: n.Status.Allocatable,
	}
}

// ServeHTTP implements http.Handler through the shared skeleton
// (serving.Serve); a refused request is counted as an error and logged at
// V(1).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { h.metrics.Duration.Observe(time.Since(start).Seconds()) }()
	if be := serving.Serve(w, r, h.Envelope, h.answer); be != nil {
		reason, ok := bodyReasons[be.Reason]
		if !ok {
			reason = "malformed"
		}
		h.log.V(1).Info("rejected malformed request", "code", be.Status, "reason", be.Msg)
		h.metrics.Mutations.WithLabelValues(outcomeError, "unknown", reason).Inc()
	}
}

// answer is the server's part of serving.Serve: parse, check, review.
func (h *Handler) answer(_ *http.Request, body, dst []byte) ([]byte, error) {
	rv, nodeErr, err := parseReview(body)
	if err != nil {
		return nil, malformed("malformed AdmissionReview: %v", err)
	}
	if rv.apiVersion != "admission.k8s.io/v1" || rv.kind != "AdmissionReview" {
		return nil, malformed("expected admission.k8s.io/v1 AdmissionReview, got apiVersion %q kind %q", rv.apiVersion, rv.kind)
	}
	req := rv.req
	if req == nil || req.UID == "" {
		return nil, malformed("AdmissionReview has no request or no request.uid")
	}
	return h.review(dst, req, nodeErr), nil
}

// malformed is the 400 answer to a body that is not a usable review.
func malformed(format string, args ...any) error {
	return serving.Refuse(http.StatusBadRequest, "malformed", fmt.Sprintf(format, args...))
}

// review decides one well-formed request and appends the response review.
func (h *Handler) review(dst []byte, req *requestJSON, decodeErr error) []byte {
	if req.Resource.Group != "" || req.Resource.Resource != "nodes" || req.SubResource != "status" || req.Operation != "UPDATE" {
		h.metrics.Mutations.WithLabelValues(outcomeIgnored, "unknown", string(reasonNotNodeStatus)).Inc()
		return appendResponse(dst, req.UID, nil, "hookwright oversell handles only UPDATE of nodes/status; "+describeRequest(req)+" admitted unchanged")
	}
	if decodeErr != nil {
		return h.problem(dst, req, WriterOther, reasonDecode, decodeErr)
	}
	snap := h.src.snapshot()
	if snap == nil || !snap.Synced {
		h.metrics.Mutations.WithLabelValues(outcomeSkipped, "unknown", string(reasonNotSynced)).Inc()
		return appendResponse(dst, req.UID, nil, "hookwright oversell: NodeOversell configuration not loaded yet; node status admitted unchanged")
	}

	name := req.Name
	if name == "" {
		name = req.Object.Metadata.Name
	}
	var (
		d       Decision
		writer  WriterClass
		patch   []byte
		patched bool
		held    bool
		act     bool
	)
	if perr := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		obj := req.Object.state()
		var policy *Policy
		policy, act = snap.RouteNode(obj, h.owner)
		writer = classifyWriter(name, req.UserInfo.Username, req.UserInfo.Groups, snap.trustedFunc(policy))
		if !act {
			return nil
		}
		in := Input{Writer: writer, Object: obj, Policy: policy}
		if req.OldObject != nil {
			old := req.OldObject.state()
			in.Old = &old
		}
		d = Decide(in)
		if writer.reportsRaw() && req.OldObject != nil {
			now := time.Now
			if h.now != nil {
				now = h.now
			}
			if patch, held = appendHoldPatch(make([]byte, 0, 512), &req.Object, req.OldObject, &d, now(), h.MaxHeartbeatAge); held {
				patched = true
				return nil
			}
		}
		patch, patched = appendPatch(make([]byte, 0, 512), obj, d)
		return nil
	}(); perr != nil {
		return h.problem(dst, req, writer, reasonPanic, perr)
	}

	if !act {
		if !req.DryRun {
			// The node's gauges are the winner's server's now.
			h.metrics.observeNode(name, &Decision{Restore: true})
		}
		h.metrics.Mutations.WithLabelValues(outcomeUnchanged, writer.String(), string(reasonOtherWinner)).Inc()
		return appendResponse(dst, req.UID, nil, "")
	}
	if d.UntrustedAllocatableWrite {
		h.metrics.untrustedWrite(req.UserInfo.Username)
		h.log.V(1).Info("untrusted allocatable write repaired", "node", name, "user", req.UserInfo.Username)
	}
	if !d.Apply && d.Reason != reasonNotSelected && d.Reason != reasonNoAllocatable {
		h.metrics.Mutations.WithLabelValues(outcomeSkipped, writer.String(), string(d.Reason)).Inc()
		h.log.Info("node status admitted unchanged: no safe decision", "node", name, "user", req.UserInfo.Username, "reason", d.Reason)
		return appendResponse(dst, req.UID, nil, "hookwright oversell: "+string(d.Reason)+"; node status admitted unchanged")
	}
	if d.Apply && !req.DryRun {
		h.metrics.observeNode(name, &d)
	}
	outcome := outcomeUnchanged
	if held {
		outcome = outcomeHeld
	} else if patched {
		outcome = outcomePatched
	} else {
		patch = nil
	}
	h.metrics.Mutations.WithLabelValues(outcome, writer.String(), string(d.Reason)).Inc()
	return appendResponse(dst, req.UID, patch, "")
}

// describeRequest names a request's operation and resource for a warning,
// e.g. "CREATE of nodes/status" or "UPDATE of widgets.example.com"; absent
// fields are named as such rather than left blank.
func describeRequest(req *requestJSON) string {
	op, res := req.Operation, req.Resource.Resource
	if op == "" {
		op = "(no operation)"
	}
	if res == "" {
		res = "(no resource)"
	}
	if req.Resource.Group != "" {
		res += "." + req.Resource.Group
	}
	if req.SubResource != "" {
		res += "/" + req.SubResource
	}
	return op + " of " + res
}

// problem answers an internal problem: allowed, no patch, a warning, a log
// line and a metric. A heartbeat is never blocked.
func (h *Handler) problem(dst []byte, req *requestJSON, writer WriterClass, reason Reason, err error) []byte {
	h.metrics.Mutations.WithLabelValues(outcomeError, writer.String(), string(reason)).Inc()
	h.log.Error(err, "node status admitted unchanged after an internal problem", "node", req.Name, "uid", req.UID, "reason", reason)
	return appendResponse(dst, req.UID, nil, "hookwright oversell: internal problem ("+string(reason)+"); node status admitted unchanged")
}

// appendResponse appends an allowed AdmissionReview v1 response with an
// optional JSON patch and an optional warning.
func appendResponse(dst []byte, uid string, patch []byte, warning string) []byte {
	dst = append(dst, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":`...)
	dst = jsonscan.AppendString(dst, uid)
	dst = append(dst, `,"allowed":true`...)
	if len(patch) > 0 {
		dst = append(dst, `,"patchType":"JSONPatch","patch":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, patch)
		dst = append(dst, '"')
	}
	if warning != "" {
		dst = append(dst, `,"warnings":[`...)
		dst = jsonscan.AppendString(dst, warning)
		dst = append(dst, ']')
	}
	return append(dst, "}}"...)
}
