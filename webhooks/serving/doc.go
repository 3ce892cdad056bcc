// Package serving is the HTTP envelope every hookwright webhook handler
// answers through: it bounds what any client, however hostile or slow, can
// make a server hold: a body size limit, a deadline for the body, and one
// budget for the bytes of all in-flight bodies (Envelope, body.go); and the
// request skeleton both admission handlers share (Serve, review.go: method,
// content type, body, pooled answer buffers), so a server adds only its
// decode, decision and metrics; and the servers' metrics convention
// (Register, metrics.go). The listener the handlers are served on (TLS,
// timeouts, connection limit, flags) is webhooks/listener.
//
// It imports only the standard library, golang.org/x/sync and the
// Prometheus client: the engines (webhooks/sidecar, webhooks/oversell)
// build on it and must stay free of Kubernetes clients, so it must not
// import controller-runtime, client-go or any other hookwright package
// (test/imports checks the whole dependency closure).
package serving
