package healthcheck

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Areas of the post-install checks, in print order; each CR adds its own
// area ("SidecarInjector NAME") between operator and admission.
const (
	AreaAPI       = "kubernetes-api"
	AreaCRDs      = "hookwright-crds"
	AreaOperator  = "hookwright-operator"
	AreaAdmission = "admission-safety"
	AreaFleet     = "sidecar-fleet"
)

// CRDNames are our CRDs, in check order.
var CRDNames = []string{
	"sidecarinjectors." + v1alpha1.GroupVersion.Group,
	"nodeoversells." + v1alpha1.GroupVersion.Group,
}

// Defaults of Facts' thresholds.
const (
	DefaultCertWarning          = 30 * 24 * time.Hour
	DefaultKubeletStatusTimeout = 10 * time.Second
)

// LabelManagedBy and ManagedByValue mark the objects the operator owns
// (the same as internal/desired's, which this package must not import).
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "hookwright"
)

// checker accumulates results.
type checker struct {
	f  Facts
	rs []Result
}

func (c *checker) add(area, id, desc string, st Status, msg, hint string) {
	c.rs = append(c.rs, Result{Area: area, ID: id, Description: desc, Status: st, Message: msg, Hint: hint})
}

// Run is `hookwright check`: every post-install check of f, in print
// order. When the API server cannot be reached only that check is
// returned (Fail), since every other one would fail the same way.
func Run(f Facts) []Result {
	f = withDefaults(f)
	c := &checker{f: f}
	if !c.apiReachable() {
		return c.rs
	}
	crdsOK := c.crds()
	c.operator()
	crs := c.customResources(crdsOK)
	c.admission(crs)
	c.fleet(crs)
	return c.rs
}

func withDefaults(f Facts) Facts {
	if f.CertWarning == 0 {
		f.CertWarning = DefaultCertWarning
	}
	if f.KubeletStatusTimeout == 0 {
		f.KubeletStatusTimeout = DefaultKubeletStatusTimeout
	}
	return f
}

func (c *checker) apiReachable() bool {
	const desc = "can reach the API server"
	if err := c.f.ServerVersion.Err; err != nil {
		msg, hint := readError("get", "/version", "", err)
		c.add(AreaAPI, "api-reachable", desc, Fail, msg, hint+"; every other check needs the API server, so none ran")
		return false
	}
	c.add(AreaAPI, "api-reachable", desc, OK, c.f.ServerVersion.Value, "")
	return true
}

// crds checks that each CRD is there, established, and serves and stores
// v1alpha1. It reports whether every one did.
func (c *checker) crds() bool {
	all := true
	want := v1alpha1.GroupVersion.Version
	for _, name := range CRDNames {
		got := c.f.CRDs[name]
		desc := "CRD " + name + " is installed"
		crd := got.Value
		switch {
		case apierrors.IsNotFound(got.Err) || (got.Err == nil && crd == nil):
			c.add(AreaCRDs, "crd-present", desc, Fail, "not found",
				"install the CRDs: make install, kubectl apply -k config/crd, or the OLM bundle")
			all = false
			continue
		case got.Err != nil:
			msg, hint := readError("get", "customresourcedefinitions.apiextensions.k8s.io", "", got.Err)
			c.add(AreaCRDs, "crd-present", desc, Fail, msg, hint)
			all = false
			continue
		}
		c.add(AreaCRDs, "crd-present", desc, OK, "", "")
		desc = "CRD " + name + " serves and stores " + want
		var served, storage bool
		for _, v := range crd.Spec.Versions {
			if v.Name == want {
				served, storage = v.Served, v.Storage
			}
		}
		established := false
		for _, cond := range crd.Status.Conditions {
			if cond.Type == "Established" && cond.Status == "True" {
				established = true
			}
		}
		switch {
		case !served || !storage:
			c.add(AreaCRDs, "crd-version", desc, Fail,
				fmt.Sprintf("versions %s", crdVersions(crd.Spec.Versions)),
				"apply the CRDs of this release (config/crd/bases); this binary reads "+v1alpha1.GroupVersion.String())
			all = false
		case !established:
			c.add(AreaCRDs, "crd-version", desc, Fail, "not Established",
				"kubectl describe crd "+name+" names why the API server did not accept it")
			all = false
		default:
			c.add(AreaCRDs, "crd-version", desc, OK, "", "")
		}
	}
	return all
}

// crdVersions lists a CRD's versions as "v1alpha1 (served, storage)".
func crdVersions(vs []apiextensionsv1.CustomResourceDefinitionVersion) string {
	var out []string
	for _, v := range vs {
		var f []string
		if v.Served {
			f = append(f, "served")
		}
		if v.Storage {
			f = append(f, "storage")
		}
		out = append(out, fmt.Sprintf("%s (%s)", v.Name, strings.Join(f, ", ")))
	}
	return strings.Join(out, "; ")
}

// operator checks the Deployment's replicas and the leader Lease.
func (c *checker) operator() {
	ns := c.f.OperatorNamespace
	desc := "the operator's Deployment has its replicas available"
	d, err := c.f.Operator.Value, c.f.Operator.Err
	switch {
	case apierrors.IsNotFound(err) || (err == nil && d == nil):
		c.add(AreaOperator, "operator-replicas", desc, Fail, "no operator Deployment in namespace "+ns,
			"install the operator (make deploy, or the OLM bundle), or pass --operator-namespace")
	case err != nil:
		msg, hint := readError("list", "deployments.apps", ns, err)
		c.add(AreaOperator, "operator-replicas", desc, Fail, msg, hint)
	default:
		want := replicas(d)
		avail := d.Status.AvailableReplicas
		msg := fmt.Sprintf("%s/%s: %d of %d available", d.Namespace, d.Name, avail, want)
		switch {
		case avail == 0:
			c.add(AreaOperator, "operator-replicas", desc, Fail, msg,
				"kubectl -n "+d.Namespace+" describe deployment "+d.Name+" and its pods' events")
		case avail < want:
			c.add(AreaOperator, "operator-replicas", desc, Warn, msg,
				"a replica is not available: kubectl -n "+d.Namespace+" get pods; the leader still works but has no standby")
		default:
			c.add(AreaOperator, "operator-replicas", desc, OK, msg, "")
		}
	}

	desc = "the operator has a current leader"
	l, err := c.f.Lease.Value, c.f.Lease.Err
	switch {
	case apierrors.IsNotFound(err) || (err == nil && l == nil):
		c.add(AreaOperator, "operator-leader", desc, Fail, "no leader election Lease in namespace "+ns,
			"no operator replica has started leading: kubectl -n "+ns+" logs deployment/hookwright-controller-manager")
	case err != nil:
		msg, hint := readError("get", "leases.coordination.k8s.io", ns, err)
		c.add(AreaOperator, "operator-leader", desc, Fail, msg, hint)
	default:
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		dur := 15 * time.Second
		if l.Spec.LeaseDurationSeconds != nil {
			dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		var renewed time.Time
		if l.Spec.RenewTime != nil {
			renewed = l.Spec.RenewTime.Time
		}
		age := c.f.Now.Sub(renewed).Round(time.Second)
		switch {
		case holder == "":
			c.add(AreaOperator, "operator-leader", desc, Fail, "the Lease has no holder",
				"no replica leads: kubectl -n "+ns+" logs deployment/hookwright-controller-manager")
		case renewed.IsZero() || age > dur:
			// A lease past its duration is free: nobody reconciles.
			c.add(AreaOperator, "operator-leader", desc, Fail,
				fmt.Sprintf("leader %s last renewed %s ago, past the %s lease", holder, age, dur),
				"the leader stopped renewing: kubectl -n "+ns+" get pods and the leader's logs")
		default:
			c.add(AreaOperator, "operator-leader", desc, OK, fmt.Sprintf("%s, renewed %s ago", holder, age), "")
		}
	}
}

func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// customResources checks each CR's conditions, certificates and webhook
// configuration, and returns the CRs that could be read.
func (c *checker) customResources(crdsOK bool) []CR {
	desc := "the SidecarInjectors and NodeOversells can be read"
	if err := c.f.CRs.Err; err != nil {
		if !crdsOK && apierrors.IsNotFound(err) {
			c.add(AreaCRDs, "cr-list", desc, Skip, "the CRDs are missing or not served", "")
			return nil
		}
		msg, hint := readError("list", "sidecarinjectors.admission.hookwright.io", "", err)
		c.add(AreaCRDs, "cr-list", desc, Fail, msg, hint)
		return nil
	}
	crs := c.f.CRs.Value
	if len(crs) == 0 {
		c.add(AreaCRDs, "cr-list", desc, Warn, "none in the cluster",
			"nothing is served until you create one: kubectl apply -f config/samples")
		return nil
	}
	c.add(AreaCRDs, "cr-list", desc, OK, fmt.Sprintf("%d", len(crs)), "")
	for _, cr := range crs {
		c.customResource(cr)
	}
	return crs
}

func (c *checker) customResource(cr CR) {
	area := cr.Kind + " " + cr.Name
	describe := fmt.Sprintf("kubectl describe %s %s", strings.ToLower(cr.Kind), cr.Name)
	for _, ct := range []struct{ typ, id string }{{v1alpha1.ConditionReady, "cr-ready"}, {v1alpha1.ConditionWebhookReachable, "cr-webhook-reachable"}} {
		desc := ct.typ + " is True"
		cond := apimeta.FindStatusCondition(cr.Conditions, ct.typ)
		switch {
		case cond == nil:
			c.add(area, ct.id, desc, Warn, "not reported yet",
				"the operator has not reconciled it: check the operator's leader and logs")
		case cond.Status == metav1.ConditionTrue:
			c.add(area, ct.id, desc, OK, "", "")
		case cond.Status == metav1.ConditionUnknown:
			c.add(area, ct.id, desc, Warn, cond.Reason+": "+cond.Message, describe)
		default:
			c.add(area, ct.id, desc, Fail, cond.Reason+": "+cond.Message, describe+" (hookwright status for the fleet)")
		}
	}
	if cr.ObservedGeneration < cr.Generation {
		c.add(area, "cr-observed", "the operator has seen the latest spec", Warn,
			fmt.Sprintf("generation %d, observed %d", cr.Generation, cr.ObservedGeneration),
			"the operator lags or is stopped: check the operator's leader")
	}

	serving := c.servingCert(area, cr)
	wh := c.webhookOf(cr)
	if wh == nil {
		return
	}
	c.webhookConfig(area, cr, wh, serving)
}

// servingCert checks the serving certificate's lifetime and returns it
// (nil when unreadable).
func (c *checker) servingCert(area string, cr CR) *x509.Certificate {
	const desc = "the serving certificate is valid"
	s, err := cr.ServingSecret.Value, cr.ServingSecret.Err
	switch {
	case apierrors.IsNotFound(err) || (err == nil && s == nil):
		c.add(area, "serving-cert", desc, Fail, "its Secret is missing",
			"the operator writes it (mode SelfSigned, CSR) or you or cert-manager do (Secret, CertManager): see the CR's CertificateReady condition")
		return nil
	case err != nil:
		msg, hint := readError("get", "secrets", cr.ServingSecretNamespace, err)
		c.add(area, "serving-cert", desc, Fail, msg, hint)
		return nil
	}
	certs := parseCerts(s.Data[corev1.TLSCertKey])
	if len(certs) == 0 {
		c.add(area, "serving-cert", desc, Fail, fmt.Sprintf("Secret %s/%s has no certificate in tls.crt", s.Namespace, s.Name),
			"see the CR's CertificateReady condition")
		return nil
	}
	leaf := certs[0]
	c.lifetime(area, "serving-cert", desc, fmt.Sprintf("Secret %s/%s", s.Namespace, s.Name), leaf,
		fmt.Sprintf("renew it: hookwright renew-certificate %s (or annotate %s)", cr.Name, v1alpha1.AnnotationRenewCertificate))
	return leaf
}

// lifetime adds the line of a certificate's remaining validity.
func (c *checker) lifetime(area, id, desc, where string, cert *x509.Certificate, hint string) {
	left := cert.NotAfter.Sub(c.f.Now)
	msg := fmt.Sprintf("%s valid until %s (%s left)", where, cert.NotAfter.UTC().Format(time.RFC3339), days(left))
	switch {
	case c.f.Now.Before(cert.NotBefore):
		c.add(area, id, desc, Fail, fmt.Sprintf("%s not valid before %s", where, cert.NotBefore.UTC().Format(time.RFC3339)),
			"the clocks of this machine and the issuer differ, or it was issued for the future")
	case left <= 0:
		c.add(area, id, desc, Fail, fmt.Sprintf("%s expired at %s", where, cert.NotAfter.UTC().Format(time.RFC3339)), hint)
	case left < c.f.CertWarning:
		c.add(area, id, desc, Warn, msg+fmt.Sprintf(", under %s", days(c.f.CertWarning)), hint)
	default:
		c.add(area, id, desc, OK, msg, "")
	}
}

func days(d time.Duration) string {
	if d >= 48*time.Hour {
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	return d.Round(time.Minute).String()
}

func parseCerts(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if cert, err := x509.ParseCertificate(blk.Bytes); err == nil {
			out = append(out, cert)
		}
	}
}

// webhookOf finds cr's webhook configuration, adding a line when it
// cannot.
func (c *checker) webhookOf(cr CR) *admissionregistrationv1.MutatingWebhookConfiguration {
	area := cr.Kind + " " + cr.Name
	const desc = "its MutatingWebhookConfiguration exists"
	if err := c.f.MutatingWebhooks.Err; err != nil {
		msg, hint := readError("list", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", err)
		c.add(area, "webhook-config", desc, Fail, msg, hint)
		return nil
	}
	for i := range c.f.MutatingWebhooks.Value {
		if w := &c.f.MutatingWebhooks.Value[i]; w.Name == cr.WebhookConfiguration {
			c.add(area, "webhook-config", desc, OK, w.Name, "")
			return w
		}
	}
	c.add(area, "webhook-config", desc, Fail, cr.WebhookConfiguration+" not found",
		"the operator creates it once the server is available: see the CR's WebhookConfigured condition")
	return nil
}

// webhookConfig checks that every webhook of wh calls a Service with
// ready endpoints and trusts a CA that verifies the serving certificate.
func (c *checker) webhookConfig(area string, cr CR, wh *admissionregistrationv1.MutatingWebhookConfiguration, serving *x509.Certificate) {
	for _, w := range wh.Webhooks {
		desc := "webhook " + w.Name + " calls a Service with ready endpoints"
		svc := w.ClientConfig.Service
		if svc == nil {
			c.add(area, "webhook-endpoints", desc, Fail, "it calls a URL, not a Service",
				"the operator writes a Service reference: something else changed "+wh.Name)
		} else {
			key := svc.Namespace + "/" + svc.Name
			got := c.f.EndpointSlices[key]
			switch {
			case got.Err != nil:
				msg, hint := readError("list", "endpointslices.discovery.k8s.io", svc.Namespace, got.Err)
				c.add(area, "webhook-endpoints", desc, Fail, msg, hint)
			default:
				n := readyEndpoints(got.Value)
				if n == 0 {
					c.add(area, "webhook-endpoints", desc, Fail, "Service "+key+" has no ready endpoint",
						"the server pods are not ready: kubectl -n "+svc.Namespace+" get pods -l app.kubernetes.io/instance="+svc.Name)
				} else {
					c.add(area, "webhook-endpoints", desc, OK, fmt.Sprintf("Service %s, %d ready", key, n), "")
				}
			}
		}

		desc = "webhook " + w.Name + " trusts the CA of the serving certificate"
		bundle := parseCerts(w.ClientConfig.CABundle)
		switch {
		case len(bundle) == 0:
			c.add(area, "webhook-cabundle", desc, Fail, "empty or unparsable caBundle",
				"the operator publishes it; see the CR's WebhookConfigured condition")
			continue
		case serving == nil:
			c.add(area, "webhook-cabundle", desc, Skip, "no serving certificate to verify", "")
			continue
		}
		ca := signer(bundle, serving, c.f.Now)
		if ca == nil {
			c.add(area, "webhook-cabundle", desc, Fail,
				fmt.Sprintf("none of the %d CA certificates in the caBundle verifies the serving certificate", len(bundle)),
				"the API server will refuse the TLS handshake: the operator repairs the caBundle; if it does not, check its logs and the CA Secret")
			continue
		}
		c.add(area, "webhook-cabundle", desc, OK, fmt.Sprintf("%d CA certificate(s), issuer %q", len(bundle), ca.Subject.CommonName), "")
		c.lifetime(area, "webhook-ca", "the CA in the caBundle is valid", "CA "+fmt.Sprintf("%q", ca.Subject.CommonName), ca,
			"rotate it: hookwright rotate-ca (or annotate the CA Secret "+v1alpha1.AnnotationRotateCA+")")
	}
}

// signer is the certificate of bundle that verifies leaf and lives
// longest, or nil. During a CA rotation the bundle holds the old and the
// new CA; the one that signs the serving certificate is what matters.
func signer(bundle []*x509.Certificate, leaf *x509.Certificate, now time.Time) *x509.Certificate {
	var best *x509.Certificate
	for _, ca := range bundle {
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if err != nil {
			continue
		}
		if best == nil || ca.NotAfter.After(best.NotAfter) {
			best = ca
		}
	}
	return best
}

func readyEndpoints(eps []discoveryv1.EndpointSlice) int {
	n := 0
	for _, s := range eps {
		for _, e := range s.Endpoints {
			// A nil ready means ready (discovery.k8s.io/v1 EndpointConditions).
			if (e.Conditions.Ready == nil || *e.Conditions.Ready) && len(e.Addresses) > 0 {
				n++
			}
		}
	}
	return n
}
