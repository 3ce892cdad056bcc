package webhookprobe

import (
	"regexp"
	"strings"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Classify names the failing step of a probe request the API server
// refused with message msg (the error's text), as a WebhookReachable
// reason. The API server's webhook dispatcher wraps a failed call as
// `failed calling webhook "<name>": failed to call webhook: <cause>`
// (k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go,
// errors.go); the cause is Go's net/http or crypto/tls error text, or
// "no endpoints available" from the endpoint resolver. A webhook that
// answered with a denial is a wrong answer; any other refusal (RBAC,
// quota, a missing namespace) is ProbeFailed, no fault of the webhook.
func Classify(webhookName, msg string) string {
	// The webhook URL carries ?timeout=: only the cause counts.
	m := strings.ToLower(quotedURL.ReplaceAllString(msg, "URL"))
	called := strings.Contains(m, "failed calling webhook") || strings.Contains(m, "failed to call webhook")
	if !called {
		if strings.Contains(m, "admission webhook \""+strings.ToLower(webhookName)+"\" denied") {
			return v1alpha1.WebhookProbeReasonWrongAnswer
		}
		return v1alpha1.WebhookProbeReasonProbeFailed
	}
	switch {
	case containsAny(m, "deadline exceeded", "timeout", "timed out"):
		return v1alpha1.WebhookProbeReasonTimeout
	case containsAny(m, "x509:", "tls:", "certificate", "handshake"):
		return v1alpha1.WebhookProbeReasonTLSError
	case containsAny(m, "connection refused", "no endpoints", "no route to host", "not found", "connection reset", "eof", "unreachable",
		"dial tcp", "while dialing", "bad gateway"):
		return v1alpha1.WebhookProbeReasonUnreachable
	}
	// Called but the answer was unusable (bad JSON, wrong UID, a patch
	// that does not apply).
	return v1alpha1.WebhookProbeReasonWrongAnswer
}

var quotedURL = regexp.MustCompile(`"https?://[^"]*"`)

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
