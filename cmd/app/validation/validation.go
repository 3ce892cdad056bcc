// Package validation is the validating admission webhook for the
// operator's own custom resources, served by the manager: a SidecarInjector
// is compiled exactly as the injector compiles it (templates parsed and
// test-rendered against a sample pod, selectors, defaultTemplates, values),
// a NodeOversell exactly as the oversell server compiles it (ratios within
// 1..10, at least one ratio, a valid nodeSelector). A CR the servers would
// ignore is rejected at apply time, with the template name and line
// (text/template reports "template: NAME:LINE: ..."); one that is valid but
// risky is admitted with warnings (warnings.go), which kubectl prints.
//
// With a server policy (Handler.Servers, the operator's
// --allowed-server-namespaces and --allowed-server-images flags) a CR whose
// server would run outside the allowed namespaces, with an image not
// allowed, or with one of the operator's own Secrets mounted is denied,
// naming the field and the flag (package internal/serverpolicy).
//
// It lives under cmd/app, the composition root, because only the manager
// serves it; the webhook servers' pods never link it. It must not import
// controllers: it compiles CRs with the servers' own code (webhooks/sidecar,
// webhooks/oversell) and internal/serverpolicy.
package validation

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/serverpolicy"
	"github.com/hookwright/hookwright/webhooks/oversell"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// Path is where the manager serves this webhook.
const Path = "/validate-hookwright"

// Handler validates CREATE and UPDATE of SidecarInjector and NodeOversell.
// Everything else is allowed; so is an UPDATE that leaves spec unchanged and
// an object being deleted (its finalizer must be removable whatever its
// spec says).
type Handler struct {
	// Servers, when set, is the operator's server policy: where a CR's
	// server may run and with which image. Nil checks none (unit tests of
	// the compile checks); the manager always sets it.
	Servers *serverpolicy.Policy
	// Holds, when set, previews what a NodeOversell update would hold
	// (internal/oversellnodes PreviewHolds): one line per node whose
	// running pods need more than the new ratios or selector give it. The
	// update is admitted (the operator holds those nodes, it does not
	// strand their pods) with a warning naming them.
	Holds func(ctx context.Context, old, cur *v1alpha1.NodeOversell) ([]string, error)
}

var _ admission.Handler = Handler{}

// Handle implements admission.Handler. A body that does not decode is the
// client's mistake (400), never a 500.
func (h Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	if req.Kind.Group != v1alpha1.GroupVersion.Group {
		return admission.Allowed("not a " + v1alpha1.GroupVersion.Group + " object")
	}
	if req.Operation == admissionv1.Update && sameSpec(req.Object.Raw, req.OldObject.Raw) {
		// Metadata or status only (the operator's finalizer, a label, the
		// pause annotation): never blocked by a spec that was admitted
		// before this webhook existed.
		return admission.Allowed("spec unchanged")
	}
	var warnings []string
	var server v1alpha1.ServerSpec
	switch req.Kind.Kind {
	case "SidecarInjector":
		si := &v1alpha1.SidecarInjector{}
		if err := json.Unmarshal(req.Object.Raw, si); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode SidecarInjector: %w", err))
		}
		if si.DeletionTimestamp != nil {
			return admission.Allowed("being deleted")
		}
		if msg := h.checkServer("SidecarInjector", si.Name, si.Spec.Server, si.Spec.Certificate); msg != "" {
			return admission.Denied(msg)
		}
		// The trial render is bounded (sidecar.MaxRenderBytes and the
		// limits beside it) and stops when the API server gives up.
		if _, err := sidecar.CompileContext(ctx, si); err != nil {
			return invalid(fmt.Sprintf("SidecarInjector %s: %v", si.Name, err))
		}
		warnings = sidecarInjectorWarnings(si)
		server = si.Spec.Server
	case "NodeOversell":
		no := &v1alpha1.NodeOversell{}
		if err := json.Unmarshal(req.Object.Raw, no); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode NodeOversell: %w", err))
		}
		if no.DeletionTimestamp != nil {
			return admission.Allowed("being deleted")
		}
		if msg := h.checkServer("NodeOversell", no.Name, no.Spec.Server, no.Spec.Certificate); msg != "" {
			return admission.Denied(msg)
		}
		p, err := oversell.CompilePolicy(no)
		if err != nil {
			return invalid(fmt.Sprintf("NodeOversell %s: %v", no.Name, err))
		}
		warnings = nodeOversellWarnings(no, p)
		server = no.Spec.Server
		if h.Holds != nil && req.Operation == admissionv1.Update {
			warnings = append(warnings, h.holdWarnings(ctx, req.OldObject.Raw, no)...)
		}
	default:
		return admission.Allowed("kind " + req.Kind.Kind + " is not validated")
	}
	warnings = append(warnings, serverWarnings(server, h.defaultNamespace())...)
	// Risky but valid: admitted, and kubectl prints each warning.
	return admission.Allowed("").WithWarnings(warnings...)
}

// checkServer is the server policy's verdict on a CR ("" when allowed, or
// no policy is set): every broken rule, each naming its field and flag. A
// policy denial is 403 Forbidden (kubectl: "Error from server
// (Forbidden)"): the object is valid, the operator may not act on it.
func (h Handler) checkServer(kind, name string, server v1alpha1.ServerSpec, cert v1alpha1.CertificateSpec) string {
	if h.Servers == nil {
		return ""
	}
	if errs := h.Servers.Check(server, cert); len(errs) > 0 {
		return fmt.Sprintf("%s %s: %v", kind, name, errs.ToAggregate())
	}
	return ""
}

// defaultNamespace is the server namespace of a CR without
// spec.server.namespace: the policy's, "" without a policy.
func (h Handler) defaultNamespace() string {
	if h.Servers == nil {
		return ""
	}
	return h.Servers.DefaultNamespace
}

// sameSpec reports whether two objects' spec fields are equal JSON values.
func sameSpec(a, b []byte) bool {
	var x, y struct {
		Spec any `json:"spec"`
	}
	if len(b) == 0 || json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x.Spec, y.Spec)
}

// invalid denies with 422 Invalid, the code the API server gives an object
// failing its own validation: the API server passes a webhook's code >= 400
// through (k8s.io/apiserver/pkg/admission/plugin/webhook/errors.ToStatusErr),
// so kubectl says "Error from server (Invalid)" rather than "Forbidden".
func invalid(msg string) admission.Response {
	r := admission.Denied(msg)
	r.Result.Code = http.StatusUnprocessableEntity
	r.Result.Reason = metav1.StatusReasonInvalid
	return r
}
