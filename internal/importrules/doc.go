// Package importrules holds one test: the import rules the package docs
// state, checked over each package's whole dependency closure (`go list
// -deps`), where depguard (.golangci.yml) sees only direct imports. A pure
// package that imports a harmless-looking package of ours which imports a
// client is as impure as one importing the client itself: that is how
// internal/desired came to link controller-runtime's manager and
// client-go's clientsets through webhooks/sidecar.
//
// The rules (rules_test.go, one entry per package, each quoting its doc):
// the pure packages (api/v1alpha1, the engines webhooks/sidecar and
// webhooks/oversell, webhooks/serving, webhooks/jsonscan, and internal/
// desired, health, certificates/pki, certificates/csrsign,
// certificates/csrplan, certificates/cadir, requeue, serverpolicy,
// webhookprobe, version, failopen) never depend on a Kubernetes client
// (client-go's kubernetes, rest, informers, dynamic and tools/cache;
// controller-runtime's client, cache and manager), the operator
// (controllers, cmd/app), image or dev tooling (hack/, such as
// hack/ociimage; go-containerregistry) or the test harness; an engine never depends on
// the other engine nor on internal/; the internal/ pure packages on no
// webhook server. An I/O shell with a rule (internal/rollout,
// cmd/app/validation) may use a
// client, and the rest holds: no operator, image tooling or harness. A failure names the chain of imports that breaks the
// rule.
//
// It has no non-test code and nothing imports it.
package importrules
