package sources

import (
	"context"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
)

// gathered is the SelfSigned state of the whole installation as read from
// the API: what both the CA controller and each CR's reconcile plan on.
type gathered struct {
	// CASecret is the CA Secret as read (nil: none).
	CASecret *corev1.Secret
	State    pki.State
	// Secrets are the serving Secrets by serving key (nil entries: missing).
	Secrets map[string]*corev1.Secret
	// CRs are the SelfSigned CRs the operator issues certificates for.
	CRs []desired.CR
	// DrainingUntil is the earliest end of a grace period still running
	// (zero: none). When it passes, certificates stop counting as in use
	// with no API event, so the CA controller wakes itself then.
	DrainingUntil time.Time
}

// gather reads the CA Secret (uncached: it is the only copy of the CA
// key), then from the cache every SelfSigned CR of both kinds with its
// serving Secret and the caBundle of its configuration as published
// (plannerView: without the CAs only extra adds). own, when set, counts
// even before the cache lists it (a CR just created).
func gather(ctx context.Context, env Env, own *desired.CR, now time.Time) (gathered, error) {
	g := gathered{Secrets: map[string]*corev1.Secret{}}
	sec, err := secretOrNil(ctx, env.APIReader, client.ObjectKey{Namespace: env.Settings.Namespace, Name: desired.CASecretName})
	if err != nil {
		return g, err
	}
	g.CASecret = sec
	var caData map[string][]byte
	if sec != nil {
		caData = sec.Data
	}
	extra := env.extra()
	g.State = pki.State{CA: caData, Published: map[string][]byte{}, Serving: map[string]pki.Serving{}}
	g.State.RotateRequested = rotateToken(sec) != ""
	if g.CRs, err = selfSignedCRs(ctx, env.Client, env.Settings); err != nil {
		return g, err
	}
	for _, cr := range g.CRs {
		k := servingKey(cr, env.Settings)
		key := client.ObjectKey{Namespace: desired.ServerNamespace(cr, env.Settings), Name: desired.ServingSecretName(cr)}
		sec, err := secretOrNil(ctx, env.Client, key)
		if err != nil {
			return g, err
		}
		tok := cr.Object.GetAnnotations()[v1alpha1.AnnotationRenewCertificate]
		if tok != "" && sec != nil && sec.Annotations[annotationRenewedFor] != tok && env.APIReader != nil {
			// A renewal looks pending: make sure from the API server. The
			// cache may not hold the Secret this operator wrote for tok a
			// moment ago, and a reconcile woken by another object would
			// renew a second time (test/operator saw it under load).
			if sec, err = secretOrNil(ctx, env.APIReader, key); err != nil {
				return g, err
			}
		}
		g.Secrets[k] = sec
		sv := servingOf(cr, env.Settings, sec)
		if tok != "" && sec != nil {
			sv.RenewRequested = sec.Annotations[annotationRenewedFor] != tok
		}
		g.State.Serving[k] = sv
		if sec != nil {
			d, until := drainingFromAnnotations(sec.Annotations, now)
			g.State.Draining = append(g.State.Draining, splitPEM(d)...)
			if d != nil && (g.DrainingUntil.IsZero() || until.Before(g.DrainingUntil)) {
				g.DrainingUntil = until
			}
		}
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		switch found, err := getOrNil(ctx, env.Client, client.ObjectKey{Name: cr.Base()}, mwc); {
		case err != nil:
			return g, err
		case found:
			// Not found: not created yet, it is created with the current bundle.
			var b []byte
			if len(mwc.Webhooks) > 0 {
				b = mwc.Webhooks[0].ClientConfig.CABundle
			}
			g.State.Published[cr.Base()] = plannerView(b, extra, caData)
		}
	}
	if own != nil {
		if k := servingKey(*own, env.Settings); !has(g.State.Serving, k) {
			g.State.Serving[k] = servingOf(*own, env.Settings, nil)
		}
	}
	return g, nil
}

// selfSignedCRs lists the CRs of both kinds (from the cache) whose
// certificates the operator issues, except those being deleted and those
// the server policy refuses (their server is not the operator's, and their
// namespace may be outside its cache and RBAC).
func selfSignedCRs(ctx context.Context, c client.Reader, s desired.Settings) ([]desired.CR, error) {
	var crs []desired.CR
	var sis v1alpha1.SidecarInjectorList
	if err := c.List(ctx, &sis); err != nil {
		return nil, err
	}
	for i := range sis.Items {
		crs = append(crs, desired.SidecarCR(&sis.Items[i]))
	}
	var nos v1alpha1.NodeOversellList
	if err := c.List(ctx, &nos); err != nil {
		return nil, err
	}
	for i := range nos.Items {
		crs = append(crs, desired.OversellCR(&nos.Items[i]))
	}
	out := crs[:0]
	pol := s.ServerPolicy()
	for _, cr := range crs {
		if desired.CertificateMode(cr) == v1alpha1.CertificateSelfSigned && cr.Object.GetDeletionTimestamp().IsZero() && len(pol.Check(cr.Server, cr.Certificate)) == 0 {
			out = append(out, cr)
		}
	}
	return out, nil
}

// servingKey names cr's serving certificate in pki.State.Serving.
func servingKey(cr desired.CR, s desired.Settings) string {
	return desired.ServerNamespace(cr, s) + "/" + desired.ServingSecretName(cr)
}

// servingOf is cr's serving certificate as the planner sees it: the
// Secret's tls.crt and tls.key (a missing key is present-but-empty, so it
// is checked) and the SANs the server must have.
func servingOf(cr desired.CR, s desired.Settings, sec *corev1.Secret) pki.Serving {
	sv := pki.Serving{DNSNames: pki.ServingDNSNames(cr.Base(), desired.ServerNamespace(cr, s), ""), Key: []byte{}}
	if sec != nil {
		sv.Cert, sv.Key = sec.Data[corev1.TLSCertKey], orEmpty(sec.Data[corev1.TLSPrivateKeyKey])
	}
	return sv
}

// rotateToken is the CA Secret's rotate-now request not yet handled
// (v1alpha1.AnnotationRotateCA), or "".
func rotateToken(sec *corev1.Secret) string {
	if sec == nil {
		return ""
	}
	if tok := sec.Annotations[v1alpha1.AnnotationRotateCA]; tok != sec.Annotations[AnnotationRotateCAHandled] {
		return tok
	}
	return ""
}

// orEmpty makes a missing key a present-but-empty one, so
// ServingRenewalReason checks it (nil would skip the key check).
func orEmpty(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func has[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}
