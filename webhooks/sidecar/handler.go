package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/serving"
)

// maxBodyBytes bounds an AdmissionReview body: 3 MiB, the API server's
// request size limit, so any legitimate pod fits (serving.DefaultMaxBody).
const maxBodyBytes = serving.DefaultMaxBody

// Handler serves AdmissionReview v1 for pod CREATE (register it at /inject).
//
// It is a plain http.Handler on the shared skeleton (serving.Serve) rather
// than a controller-runtime admission.Handler because admission.Webhook
// caps bodies at 7 MiB, answers malformed input with HTTP 200, decodes
// through the runtime codecs and always recomputes the patch from a second
// marshal of the object; here the 3 MiB limit, real 4xx statuses and one
// decode of the pod are needed to meet the size and latency budget. The API
// server treats a non-200 as a call failure and applies failurePolicy,
// which is right for garbage.
type Handler struct {
	Store  *Store
	Params Params
	Log    logr.Logger
	// Metrics records every answer (required; see NewMetrics).
	Metrics *Metrics
	// Injector names the SidecarInjector in metrics before a config is loaded.
	Injector string
	// Envelope bounds body size, read time and in-flight bytes; nil means
	// the process-wide Envelope with the default bounds (serving.Serve).
	Envelope *serving.Envelope
}

// bodyReasons maps the skeleton's reasons to failure reasons; the handler's
// own refusals carry theirs.
var bodyReasons = map[string]string{
	serving.ReasonMethod:      failBadMethod,
	serving.ReasonContentType: failContentType,
	serving.ReasonTooLarge:    failTooLarge,
	serving.ReasonTimeout:     failTimeout,
	serving.ReasonBusy:        failBusy,
	serving.ReasonRead:        failBadReview,
}

// ServeHTTP answers one AdmissionReview. Malformed requests get 405, 415,
// 413 or 400 with a plain-text reason, a body not received within the
// request timeout 408, a body refused while the in-flight budget is full
// 429 (serving.Serve), and 503 while no config is loaded.
// Well-formed reviews always get 200 with an AdmissionResponse.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	cfg := h.Store.Load()
	injector := h.Injector
	if cfg != nil {
		injector = cfg.Name
	}
	defer func() { h.Metrics.duration.WithLabelValues(injector).Observe(time.Since(start).Seconds()) }()
	be := serving.Serve(w, r, h.Envelope, func(r *http.Request, body, dst []byte) ([]byte, error) {
		return h.answer(r, cfg, body, dst)
	})
	if be != nil {
		reason, ok := bodyReasons[be.Reason]
		if !ok {
			reason = be.Reason
		}
		h.Metrics.fail(injector, reason)
		h.Log.Info("rejected admission request", "reason", reason, "error", be.Msg)
	}
}

// answer is the server's part of serving.Serve: decode, check, review with
// cfg (the config loaded when the request arrived), encode.
func (h *Handler) answer(r *http.Request, cfg *Config, body, dst []byte) ([]byte, error) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, serving.Refuse(http.StatusBadRequest, failBadReview, "body is not a JSON AdmissionReview: "+err.Error())
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return nil, serving.Refuse(http.StatusBadRequest, failBadReview, fmt.Sprintf("got apiVersion %q kind %q: want admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind))
	}
	if review.Request == nil {
		return nil, serving.Refuse(http.StatusBadRequest, failBadReview, "AdmissionReview has no request")
	}
	if cfg == nil {
		return nil, serving.Refuse(http.StatusServiceUnavailable, failNoConfig, ErrNoConfig.Error())
	}
	resp := h.reviewContext(r.Context(), cfg, review.Request)
	// Encoded straight into the pooled buffer, without the trailing newline
	// json.Encoder adds: the same bytes json.Marshal returns.
	buf := bytes.NewBuffer(dst)
	if err := json.NewEncoder(buf).Encode(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}); err != nil {
		return nil, serving.Refuse(http.StatusBadRequest, failInternal, "encoding response: "+err.Error())
	}
	out := buf.Bytes()
	return out[:len(out)-1], nil
}

// reviewContext answers one admission request with cfg. It never reads
// DryRun: injection has no side effects, so dry-run requests get the same
// answer. It stops rendering once ctx is done (the API server closed the
// request after its webhook timeout) and denies with reason Canceled;
// nobody reads that answer, it just frees the CPU.
func (h *Handler) reviewContext(ctx context.Context, cfg *Config, req *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse) {
	injector := cfg.Name
	resp = &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	log := h.Log.WithValues("namespace", req.Namespace, "uid", req.UID)
	deny := func(code int32, reason, msg string) *admissionv1.AdmissionResponse {
		h.Metrics.fail(injector, reason)
		log.Info("denied pod", "reason", reason, "error", msg)
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: metav1.StatusReason(reason), Message: msg}
		return resp
	}
	defer func() {
		// A bug must not take the server down or surface as a 500.
		if p := recover(); p != nil {
			resp = &admissionv1.AdmissionResponse{UID: req.UID}
			resp = deny(http.StatusInternalServerError, failInternal, fmt.Sprintf("%s: internal error: %v", injector, p))
		}
	}()
	if req.Kind.Group != "" || req.Kind.Version != "v1" || req.Kind.Kind != "Pod" ||
		req.Resource.Group != "" || req.Resource.Resource != "pods" || req.SubResource != "" {
		return deny(http.StatusBadRequest, failWrongResource, fmt.Sprintf("%s: expected a v1 pods request, got kind %s resource %s subresource %q", injector, req.Kind.String(), req.Resource.String(), req.SubResource))
	}
	if req.Operation != admissionv1.Create {
		h.Metrics.skips.WithLabelValues(injector, "Operation").Inc()
		h.Metrics.requests.WithLabelValues(injector, outcomeSkipped).Inc()
		resp.Warnings = []string{fmt.Sprintf("%s: not injected: operation %s (only CREATE is handled)", injector, req.Operation)}
		return resp
	}
	res, err := Inject(cfg, h.Params, Input{Raw: req.Object.Raw, Namespace: req.Namespace, WantPatch: true, Context: ctx})
	var rerr *RenderError
	var derr *DecodeError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return deny(http.StatusGatewayTimeout, failCanceled, fmt.Sprintf("%s: request abandoned: %v", injector, err))
	case errors.As(err, &derr):
		return deny(http.StatusBadRequest, failDecode, fmt.Sprintf("%s: %v", injector, derr))
	case errors.As(err, &rerr):
		msg := fmt.Sprintf("%s: sidecar injection failed: %v", injector, rerr)
		if cfg.FailurePolicy != v1alpha1.FailurePolicyIgnore {
			code := int32(http.StatusInternalServerError)
			if rerr.ByPod {
				code = http.StatusBadRequest // the pod's own annotation is wrong
			}
			return deny(code, failRender, msg)
		}
		h.Metrics.failures.WithLabelValues(injector, failRender).Inc()
		h.Metrics.requests.WithLabelValues(injector, outcomeRenderAllow).Inc()
		h.Metrics.warnings.WithLabelValues(injector).Inc()
		log.Info("allowed pod without injection after render failure (failurePolicy Ignore)", "error", rerr.Error())
		resp.Warnings = []string{msg + " (failurePolicy Ignore: admitted without sidecars)"}
		return resp
	case err != nil:
		return deny(http.StatusInternalServerError, failInternal, fmt.Sprintf("%s: %v", injector, err))
	}
	for _, wmsg := range res.Warnings {
		resp.Warnings = append(resp.Warnings, injector+": "+wmsg)
	}
	if len(res.Warnings) > 0 {
		h.Metrics.warnings.WithLabelValues(injector).Add(float64(len(res.Warnings)))
	}
	d := res.Decision
	if !res.Injected {
		h.Metrics.skips.WithLabelValues(injector, string(d.Code)).Inc()
		h.Metrics.requests.WithLabelValues(injector, outcomeSkipped).Inc()
		// Reinvocation and kube-injected pods come back already injected:
		// that is expected, so it is logged at V(1) and not warned about.
		if d.Code == CodeAlreadyInjected {
			log.V(1).Info("pod not injected", "pod", res.PodName, "reason", d.Reason)
		} else {
			log.Info("pod not injected", "pod", res.PodName, "reason", d.Reason)
			resp.Warnings = append(resp.Warnings, injector+": not injected: "+d.Reason)
		}
		return resp
	}
	h.Metrics.injections.WithLabelValues(injector, string(d.Code)).Inc()
	h.Metrics.requests.WithLabelValues(injector, outcomeInjected).Inc()
	log.V(1).Info("pod injected", "pod", res.PodName, "reason", d.Reason, "templates", res.Templates)
	if len(res.Patch) > 0 && string(res.Patch) != "[]" {
		pt := admissionv1.PatchTypeJSONPatch
		resp.PatchType = &pt
		resp.Patch = res.Patch
	}
	return resp
}

// Configz is the JSON served at /configz.
type Configz struct {
	Injector   string `json:"injector"`
	Loaded     bool   `json:"loaded"`
	Generation int64  `json:"generation"`
	Hash       string `json:"hash,omitempty"`
	// LastError is the compile error of the newest version, when it was rejected.
	LastError string `json:"lastError,omitempty"`
}

// ConfigzHandler serves the store's state as Configz JSON, so the operator
// can tell which generation each server runs.
func (s *Store) ConfigzHandler(injector string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		z := Configz{Injector: injector}
		if c := s.Load(); c != nil {
			z.Loaded, z.Generation, z.Hash = true, c.Generation, c.Hash
		}
		if err := s.lastError(); err != nil {
			z.LastError = err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(z)
	})
}
