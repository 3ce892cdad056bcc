// Package failopen decides, as pure functions, what happens to hookwright's
// webhook configurations when the operator is uninstalled while CRs remain:
// whether the operator is gone (OperatorGone) and which webhooks of a
// configuration to switch to failurePolicy Ignore, as a JSON patch
// (MutatingPatch, ValidatingPatch). Two shells act on it: the manager as
// it exits (cmd/app/uninstall.go) and each injector server on a
// period (cmd/failopen.go), which is the path that works when the
// install's RBAC goes with the operator (Helm, OLM and `kubectl delete -k`
// delete the operator's ServiceAccount and bindings with its Deployment).
//
// It must not import a Kubernetes client, the operator or the webhook
// servers: both shells import it.
package failopen

import (
	"encoding/json"
	"strconv"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
)

// OperatorGone reports whether the operator's own Deployment says the
// operator is going away for good, not restarting: it is gone (found
// false: OLM deleted the CSV, `helm uninstall`, `make undeploy`), being
// deleted, or scaled to zero. A rolling update or a crashed pod keeps it,
// with replicas (unset replicas default to 1).
func OperatorGone(dep *appsv1.Deployment, found bool) bool {
	if !found || dep == nil {
		return true
	}
	return dep.DeletionTimestamp != nil || (dep.Spec.Replicas != nil && *dep.Spec.Replicas == 0)
}

// toSwitch returns the indices of the webhooks whose failurePolicy is not
// Ignore; nil counts as Fail, the API server's default for
// admissionregistration/v1.
func toSwitch(policies []*admissionregistrationv1.FailurePolicyType) []int {
	var idx []int
	for i, p := range policies {
		if p == nil || *p != admissionregistrationv1.Ignore {
			idx = append(idx, i)
		}
	}
	return idx
}

// op is one RFC 6902 JSON patch operation.
type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// ignorePatch is a JSON patch that sets failurePolicy Ignore on the
// webhooks at idx, each guarded by a test of the webhook's name: a
// configuration rewritten meanwhile (webhooks reordered) fails the whole
// patch (422) rather than switch another webhook. nil when idx is empty.
func ignorePatch(names []string, idx []int) []byte {
	if len(idx) == 0 {
		return nil
	}
	ops := make([]op, 0, 2*len(idx))
	for _, i := range idx {
		p := "/webhooks/" + strconv.Itoa(i)
		ops = append(ops, op{Op: "test", Path: p + "/name", Value: names[i]},
			op{Op: "add", Path: p + "/failurePolicy", Value: string(admissionregistrationv1.Ignore)})
	}
	b, _ := json.Marshal(ops) // strings and ints only: cannot fail
	return b
}

// MutatingPatch returns the JSON patch (types.JSONPatchType) switching
// every webhook of m that is not Ignore to Ignore, and the names of those
// webhooks; nil, nil when all are Ignore already (nothing to write).
func MutatingPatch(m *admissionregistrationv1.MutatingWebhookConfiguration) ([]byte, []string) {
	names := make([]string, len(m.Webhooks))
	ps := make([]*admissionregistrationv1.FailurePolicyType, len(m.Webhooks))
	for i, w := range m.Webhooks {
		names[i], ps[i] = w.Name, w.FailurePolicy
	}
	return plan(names, ps)
}

// ValidatingPatch is MutatingPatch for a ValidatingWebhookConfiguration.
func ValidatingPatch(v *admissionregistrationv1.ValidatingWebhookConfiguration) ([]byte, []string) {
	names := make([]string, len(v.Webhooks))
	ps := make([]*admissionregistrationv1.FailurePolicyType, len(v.Webhooks))
	for i, w := range v.Webhooks {
		names[i], ps[i] = w.Name, w.FailurePolicy
	}
	return plan(names, ps)
}

func plan(names []string, ps []*admissionregistrationv1.FailurePolicyType) ([]byte, []string) {
	idx := toSwitch(ps)
	if len(idx) == 0 {
		return nil, nil
	}
	switched := make([]string, len(idx))
	for j, i := range idx {
		switched[j] = names[i]
	}
	return ignorePatch(names, idx), switched
}
