// Package healthcheck decides `hookwright check [--pre]`: every check is a
// pure function of Facts, which the command gathers from the cluster, and
// returns Results (one line each, grouped by area, with a hint for every
// warning and failure). The shape follows linkerd's `linkerd check`
// (linkerd2 pkg/healthcheck): categories, a hint per failure, warnings that
// do not fail the run, and a fatal check that stops the rest.
//
// It must not import a Kubernetes client, the operator or the webhook
// servers: it judges facts, it does not fetch them. It uses api/v1alpha1
// only among hookwright's packages.
package healthcheck
