package controllers

import (
	"bytes"
	"crypto/x509"
	"time"

	"github.com/hookwright/hookwright/internal/certs"
)

// AnnotationPreviousCAUntil on a webhook configuration (modes CertManager
// and Secret): until this time (RFC 3339) its caBundle keeps the CAs it
// carried before ca.crt changed, next to the new ones.
const AnnotationPreviousCAUntil = "admission.hookwright.io/previous-ca-until"

// CAOverlap is the caBundle to publish in modes CertManager and Secret.
type CAOverlap struct {
	// Bundle is next, followed by the previous CAs while the overlap lasts.
	Bundle []byte
	// Until is when the previous CAs are dropped; zero when none are kept.
	Until time.Time
}

// OverlapCABundle keeps the CAs a configuration published (live) for grace
// after its Secret's ca.crt becomes next: the Secret's tls.crt changes with
// ca.crt, but pods serve the old certificate until the kubelet updates the
// mounted Secret (its sync period plus cache TTL, about 1–2 min) and
// certwatcher reloads it, so publishing next alone fails every admission
// in between. SelfSigned mode gets the same overlap from its planner.
//
// A change is a next with a CA that live lacks; it starts (or restarts) the
// overlap at now. Otherwise the overlap recorded in liveUntil continues
// until it ends. CAs in live but not in next with no running overlap (a
// foreign CA written into the configuration) are not kept: that is drift.
// Expired CAs are never kept. next is published byte for byte.
func OverlapCABundle(next, live []byte, liveUntil, now time.Time, grace time.Duration) CAOverlap {
	nextCerts, err := certs.ParseCertsPEM(next)
	if err != nil || len(live) == 0 {
		return CAOverlap{Bundle: next}
	}
	liveCerts, err := certs.ParseCertsPEM(live)
	if err != nil {
		return CAOverlap{Bundle: next}
	}
	in := func(c *x509.Certificate, set []*x509.Certificate) bool {
		for _, s := range set {
			if s.Equal(c) {
				return true
			}
		}
		return false
	}
	until := liveUntil
	for _, c := range nextCerts {
		if !in(c, liveCerts) {
			// Whole seconds, as the annotation records it, rounded up so
			// the overlap is never shorter than grace.
			until = now.Add(grace + time.Second - 1).Truncate(time.Second)
			break
		}
	}
	if !now.Before(until) {
		return CAOverlap{Bundle: next}
	}
	var previous []*x509.Certificate
	for _, c := range liveCerts {
		if !in(c, nextCerts) && now.Before(c.NotAfter) {
			previous = append(previous, c)
		}
	}
	if len(previous) == 0 {
		return CAOverlap{Bundle: next}
	}
	b := bytes.TrimRight(next, "\n")
	out := append(append([]byte{}, b...), '\n')
	out = append(out, certs.BuildBundle(previous, certs.BundleOptions{Max: -1})...)
	return CAOverlap{Bundle: out, Until: until}
}

// previousCAUntil reads AnnotationPreviousCAUntil; zero when absent or bad.
func previousCAUntil(ann map[string]string) time.Time {
	t, err := time.Parse(time.RFC3339, ann[AnnotationPreviousCAUntil])
	if err != nil {
		return time.Time{}
	}
	return t
}
