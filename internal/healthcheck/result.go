package healthcheck

import (
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Status is a check's outcome.
type Status string

const (
	// OK is a passed check.
	OK Status = "ok"
	// Warn is reported with a hint, but the run still succeeds.
	Warn Status = "warn"
	// Fail makes the run fail (non-zero exit).
	Fail Status = "fail"
	// Skip is a check not run because one it depends on failed.
	Skip Status = "skip"
)

// Result is one check's line.
type Result struct {
	// Area groups lines, e.g. "kubernetes-api" or "SidecarInjector sidecar-injector".
	Area string `json:"area"`
	// ID is stable across releases and names the docs/cli.md section
	// ("check-<id>"), e.g. "crd-version".
	ID string `json:"id"`
	// Description says what is checked, as a statement that holds when it passes.
	Description string `json:"description"`
	Status      Status `json:"status"`
	// Message is the finding: what was seen (for OK too, when useful).
	Message string `json:"message,omitempty"`
	// Hint says what to do; set for Warn and Fail.
	Hint string `json:"hint,omitempty"`
}

// Got is one gathered fact and the error reading it.
type Got[T any] struct {
	Value T
	Err   error
}

// Summary counts results by status.
type Summary struct {
	OK, Warnings, Failures, Skipped int
}

// Summarize counts rs; the run fails when Failures > 0.
func Summarize(rs []Result) Summary {
	var s Summary
	for _, r := range rs {
		switch r.Status {
		case OK:
			s.OK++
		case Warn:
			s.Warnings++
		case Fail:
			s.Failures++
		case Skip:
			s.Skipped++
		}
	}
	return s
}

// readError is a failed request as a check's message and hint: a refusal
// by RBAC names the right to grant, an absent object or API says so,
// anything else is passed through. verb and resource are RBAC's
// ("list", "mutatingwebhookconfigurations.admissionregistration.k8s.io");
// ns is empty for cluster-scoped resources.
func readError(verb, resource, ns string, err error) (msg, hint string) {
	what := verb + " " + resource
	canI := "kubectl auth can-i " + what
	if ns != "" {
		what += " in namespace " + ns
		canI += " -n " + ns
	}
	var status apierrors.APIStatus
	switch {
	case apierrors.IsForbidden(err):
		return "forbidden: cannot " + what,
			fmt.Sprintf("run as a user allowed to %s (%s), e.g. with --as", what, canI)
	case apierrors.IsUnauthorized(err):
		return "unauthorized: the API server did not accept the credentials",
			"check the kubeconfig's user (kubectl config view --minify)"
	case apierrors.IsNotFound(err) && errors.As(err, &status):
		return "not found: " + status.Status().Message, "check the name and namespace"
	}
	return fmt.Sprintf("cannot %s: %v", what, err), "check that the API server is reachable (kubectl cluster-info)"
}
