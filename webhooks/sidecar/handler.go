package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/webhooks/serving"
)

// MaxBodyBytes bounds an AdmissionReview body: 3 MiB, the API server's
// request size limit, so any legitimate pod fits (serving.DefaultMaxBody).
const MaxBodyBytes = serving.DefaultMaxBody

// Handler serves AdmissionReview v1 for pod CREATE (register it at /inject).
//
// It is a plain http.Handler rather than a controller-runtime
// admission.Handler because admission.Webhook caps bodies at 7 MiB, answers
// malformed input with HTTP 200, decodes through the runtime codecs and
// always recomputes the patch from a second marshal of the object; here the
// 3 MiB limit, real 4xx statuses and one decode of the pod are needed to meet
// the size and latency budget. The API server treats a non-200 as a call
// failure and applies failurePolicy, which is right for garbage.
type Handler struct {
	Store  *Store
	Params Params
	Log    logr.Logger
	// Injector names the SidecarInjector in metrics before a config is loaded.
	Injector string
	// Envelope bounds body size, read time and in-flight bytes; nil means
	// serving.DefaultEnvelope().
	Envelope *serving.Envelope
}

// bodyReasons maps the envelope's reasons to failure reasons.
var bodyReasons = map[string]string{
	serving.ReasonTooLarge: FailTooLarge,
	serving.ReasonTimeout:  FailTimeout,
	serving.ReasonBusy:     FailBusy,
	serving.ReasonRead:     FailBadReview,
}

func (h *Handler) envelope() *serving.Envelope {
	if h.Envelope != nil {
		return h.Envelope
	}
	return serving.DefaultEnvelope()
}

// ServeHTTP answers one AdmissionReview. Malformed requests get 405, 415,
// 413 or 400 with a plain-text reason, a body not received within the
// request timeout 408, a body refused while the in-flight budget is full
// 429 (serving.Envelope), and 503 while no config is loaded.
// Well-formed reviews always get 200 with an AdmissionResponse.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	cfg := h.Store.Load()
	injector := h.Injector
	if cfg != nil {
		injector = cfg.Name
	}
	defer func() { durationSeconds.WithLabelValues(injector).Observe(time.Since(start).Seconds()) }()
	fail := func(code int, reason, msg string) {
		requestsTotal.WithLabelValues(injector, outcomeFailed).Inc()
		failuresTotal.WithLabelValues(injector, reason).Inc()
		h.Log.Info("rejected admission request", "reason", reason, "error", msg)
		http.Error(w, msg, code)
	}
	if r.Method != http.MethodPost {
		fail(http.StatusMethodNotAllowed, FailBadMethod, "method "+r.Method+" not allowed: POST an AdmissionReview")
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		fail(http.StatusUnsupportedMediaType, FailContentType, fmt.Sprintf("content type %q not supported: want application/json", r.Header.Get("Content-Type")))
		return
	}
	body, err := h.envelope().Read(w, r)
	if err != nil {
		reason := FailBadReview
		if be := (*serving.BodyError)(nil); errors.As(err, &be) {
			reason = bodyReasons[be.Reason]
		}
		requestsTotal.WithLabelValues(injector, outcomeFailed).Inc()
		failuresTotal.WithLabelValues(injector, reason).Inc()
		h.Log.Info("rejected admission request", "reason", reason, "error", err.Error())
		serving.Fail(w, err)
		return
	}
	defer body.Release()
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body.Bytes(), &review); err != nil {
		fail(http.StatusBadRequest, FailBadReview, "body is not a JSON AdmissionReview: "+err.Error())
		return
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		fail(http.StatusBadRequest, FailBadReview, fmt.Sprintf("got apiVersion %q kind %q: want admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind))
		return
	}
	if review.Request == nil {
		fail(http.StatusBadRequest, FailBadReview, "AdmissionReview has no request")
		return
	}
	if cfg == nil {
		fail(http.StatusServiceUnavailable, FailNoConfig, ErrNoConfig.Error())
		return
	}
	resp := h.ReviewContext(r.Context(), cfg, review.Request)
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		fail(http.StatusBadRequest, FailInternal, "encoding response: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// Review answers one admission request with cfg. It never reads DryRun:
// injection has no side effects, so dry-run requests get the same answer.
func (h *Handler) Review(cfg *Config, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	return h.ReviewContext(context.Background(), cfg, req)
}

// ReviewContext is Review that stops rendering once ctx is done (the API
// server closed the request after its webhook timeout) and denies with
// reason Canceled; nobody reads that answer, it just frees the CPU.
func (h *Handler) ReviewContext(ctx context.Context, cfg *Config, req *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse) {
	injector := cfg.Name
	resp = &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	log := h.Log.WithValues("namespace", req.Namespace, "uid", req.UID)
	deny := func(code int32, reason, msg string) *admissionv1.AdmissionResponse {
		requestsTotal.WithLabelValues(injector, outcomeFailed).Inc()
		failuresTotal.WithLabelValues(injector, reason).Inc()
		log.Info("denied pod", "reason", reason, "error", msg)
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: metav1.StatusReason(reason), Message: msg}
		return resp
	}
	defer func() {
		// A bug must not take the server down or surface as a 500.
		if p := recover(); p != nil {
			resp = &admissionv1.AdmissionResponse{UID: req.UID}
			resp = deny(http.StatusInternalServerError, FailInternal, fmt.Sprintf("%s: internal error: %v", injector, p))
		}
	}()
	if req.Kind.Group != "" || req.Kind.Version != "v1" || req.Kind.Kind != "Pod" ||
		req.Resource.Group != "" || req.Resource.Resource != "pods" || req.SubResource != "" {
		return deny(http.StatusBadRequest, FailWrongResource, fmt.Sprintf("%s: expected a v1 pods request, got kind %s resource %s subresource %q", injector, req.Kind.String(), req.Resource.String(), req.SubResource))
	}
	if req.Operation != admissionv1.Create {
		skipsTotal.WithLabelValues(injector, "Operation").Inc()
		requestsTotal.WithLabelValues(injector, outcomeSkipped).Inc()
		resp.Warnings = []string{fmt.Sprintf("%s: not injected: operation %s (only CREATE is handled)", injector, req.Operation)}
		return resp
	}
	res, err := Inject(cfg, h.Params, Input{Raw: req.Object.Raw, Namespace: req.Namespace, WantPatch: true, Context: ctx})
	var rerr *RenderError
	var derr *DecodeError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return deny(http.StatusGatewayTimeout, FailCanceled, fmt.Sprintf("%s: request abandoned: %v", injector, err))
	case errors.As(err, &derr):
		return deny(http.StatusBadRequest, FailDecode, fmt.Sprintf("%s: %v", injector, derr))
	case errors.As(err, &rerr):
		msg := fmt.Sprintf("%s: sidecar injection failed: %v", injector, rerr)
		if cfg.FailurePolicy != v1alpha1.FailurePolicyIgnore {
			code := int32(http.StatusInternalServerError)
			if rerr.ByPod {
				code = http.StatusBadRequest // the pod's own annotation is wrong
			}
			return deny(code, FailRender, msg)
		}
		failuresTotal.WithLabelValues(injector, FailRender).Inc()
		requestsTotal.WithLabelValues(injector, outcomeRenderAllow).Inc()
		warningsTotal.WithLabelValues(injector).Inc()
		log.Info("allowed pod without injection after render failure (failurePolicy Ignore)", "error", rerr.Error())
		resp.Warnings = []string{msg + " (failurePolicy Ignore: admitted without sidecars)"}
		return resp
	case err != nil:
		return deny(http.StatusInternalServerError, FailInternal, fmt.Sprintf("%s: %v", injector, err))
	}
	for _, wmsg := range res.Warnings {
		resp.Warnings = append(resp.Warnings, injector+": "+wmsg)
	}
	if len(res.Warnings) > 0 {
		warningsTotal.WithLabelValues(injector).Add(float64(len(res.Warnings)))
	}
	d := res.Decision
	if !res.Injected {
		skipsTotal.WithLabelValues(injector, string(d.Code)).Inc()
		requestsTotal.WithLabelValues(injector, outcomeSkipped).Inc()
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
	injectionsTotal.WithLabelValues(injector, string(d.Code)).Inc()
	requestsTotal.WithLabelValues(injector, outcomeInjected).Inc()
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
		if err := s.LastError(); err != nil {
			z.LastError = err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(z)
	})
}
