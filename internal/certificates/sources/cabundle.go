package sources

import (
	"bytes"
	"crypto/x509"
	"time"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// Publish writes into want, a CR's desired MutatingWebhookConfiguration
// (built without a caBundle), the caBundle its source's state st calls
// for, given the live configuration (nil: none yet). It and
// PublishValidating are the one place a webhook configuration's caBundle
// is decided and set. ok is false when no usable certificate exists: want
// must then not be written, so the API server is never pointed at a
// server it cannot verify. requeueAfter, when set, is when the CAs the
// configuration carried before a ca.crt change leave it (the overlap,
// recorded in the previous-ca-until annotation).
func Publish(want, live *admissionregistrationv1.MutatingWebhookConfiguration, st State, now time.Time, grace time.Duration) (ok bool, requeueAfter time.Duration) {
	if len(st.CABundle) == 0 || st.BundleOnly && live == nil {
		return false, 0
	}
	bundle := st.CABundle
	switch injected := injectedCABundle(live); {
	case st.Publish == publishAsIs || live == nil:
	case st.Publish == publishUnlessInjected && injected != nil:
		bundle = injected
	case len(live.Webhooks) > 0:
		o := overlapCABundle(st.CABundle, live.Webhooks[0].ClientConfig.CABundle, previousCAUntil(live.Annotations), now, grace)
		bundle = o.Bundle
		if !o.Until.IsZero() {
			if want.Annotations == nil {
				want.Annotations = map[string]string{}
			}
			want.Annotations[annotationPreviousCAUntil] = fmtTime(o.Until)
			requeueAfter = max(o.Until.Sub(now), time.Second)
		}
	}
	for i := range want.Webhooks {
		want.Webhooks[i].ClientConfig.CABundle = bundle
	}
	return true, requeueAfter
}

// PublishValidating writes into want, the manager's own
// ValidatingWebhookConfiguration, its caBundle: the CA Secret's ca.crt
// (which carries a staged CA from the moment it is staged, before it signs)
// and the --ca-dir CAs (extra).
func PublishValidating(want *admissionregistrationv1.ValidatingWebhookConfiguration, caData map[string][]byte, extra []byte) {
	bundle := unionBundle(caData[pki.SecretKeyBundle], extra)
	for i := range want.Webhooks {
		want.Webhooks[i].ClientConfig.CABundle = bundle
	}
}

// injectedCABundle is the caBundle to keep in the webhook configuration
// when cert-manager's cainjector owns it: a live configuration annotated
// with cert-manager.io/inject-ca-from (or inject-ca-from-secret) keeps its
// non-empty caBundle, so the operator never fights cainjector over it. Nil
// means the operator publishes its own.
func injectedCABundle(live *admissionregistrationv1.MutatingWebhookConfiguration) []byte {
	if live == nil {
		return nil
	}
	a := live.GetAnnotations()
	if a[cmapi.WantInjectAnnotation] == "" && a[cmapi.WantInjectFromSecretAnnotation] == "" {
		return nil
	}
	if len(live.Webhooks) == 0 || len(live.Webhooks[0].ClientConfig.CABundle) == 0 {
		return nil
	}
	return live.Webhooks[0].ClientConfig.CABundle
}

// annotationPreviousCAUntil on a webhook configuration (modes CertManager
// and Secret): until this time (RFC 3339) its caBundle keeps the CAs it
// carried before ca.crt changed, next to the new ones.
const annotationPreviousCAUntil = "admission.hookwright.io/previous-ca-until"

// caOverlap is the caBundle to publish in modes CertManager and Secret.
type caOverlap struct {
	// Bundle is next, followed by the previous CAs while the overlap lasts.
	Bundle []byte
	// Until is when the previous CAs are dropped; zero when none are kept.
	Until time.Time
}

// overlapCABundle keeps the CAs a configuration published (live) for grace
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
func overlapCABundle(next, live []byte, liveUntil, now time.Time, grace time.Duration) caOverlap {
	nextCerts, err := pki.ParseCertsPEM(next)
	if err != nil || len(live) == 0 {
		return caOverlap{Bundle: next}
	}
	liveCerts, err := pki.ParseCertsPEM(live)
	if err != nil {
		return caOverlap{Bundle: next}
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
		return caOverlap{Bundle: next}
	}
	var previous []*x509.Certificate
	for _, c := range liveCerts {
		if !in(c, nextCerts) && now.Before(c.NotAfter) {
			previous = append(previous, c)
		}
	}
	if len(previous) == 0 {
		return caOverlap{Bundle: next}
	}
	b := bytes.TrimRight(next, "\n")
	out := append(append([]byte{}, b...), '\n')
	out = append(out, pki.BuildBundle(previous, pki.BundleOptions{Max: -1})...)
	return caOverlap{Bundle: out, Until: until}
}

// previousCAUntil reads annotationPreviousCAUntil; zero when absent or bad.
func previousCAUntil(ann map[string]string) time.Time {
	t, err := time.Parse(time.RFC3339, ann[annotationPreviousCAUntil])
	if err != nil {
		return time.Time{}
	}
	return t
}
