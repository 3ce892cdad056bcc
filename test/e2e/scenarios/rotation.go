package scenarios

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/certificates/pki"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	// csrInjectorName is scenario 6's SidecarInjector in mode CSR.
	csrInjectorName = "csr-injector"
	// csrNamespace is the namespace it selects.
	csrNamespace = "lab-csr"
	// operatorSigner is the operator's own signerName (--csr-signer-name).
	operatorSigner = "hookwright.io/webhook-serving"
	// rotationLoad is the dry-run pod creates per second during scenario 6.
	rotationLoad = 50
	// rotationBaseline is the admissions per namespace counted before
	// the rotation and after the new certificate is served: 2 s of the
	// load on an idle machine (it alternates between two namespaces).
	rotationBaseline = 2 * rotationLoad / 2
	// rotationInflight caps the creates in flight (startAdmissionLoad).
	rotationInflight = 16
)

// admissionLoad counts the answers of one loop of dry-run writes:
// scenario 6's pod creates in namespace ns, or other writes (ns then
// names the loop).
type admissionLoad struct {
	ns                            string
	attempted, failed, uninjected atomic.Int64
	mu                            sync.Mutex
	firstErrs                     []string
}

func (l *admissionLoad) record(p *corev1.Pod, err error) {
	l.recordErr(err)
	if err == nil && injectedOnce(p) != nil {
		l.uninjected.Add(1)
	}
}

// recordErr counts one answer, failed when err is not nil.
func (l *admissionLoad) recordErr(err error) {
	l.attempted.Add(1)
	if err != nil {
		l.failed.Add(1)
		l.mu.Lock()
		if len(l.firstErrs) < 3 {
			l.firstErrs = append(l.firstErrs, time.Now().Format("15:04:05.000")+" "+err.Error())
		}
		l.mu.Unlock()
	}
}

// Rotation is scenario 6: an administrator starts an installation-CA
// rotation at once (`hookwright rotate-ca`'s annotation, written with
// kubectl) while server-side dry-run pod creates run at 50 per second
// against two SidecarInjectors side by side, the SelfSigned sample and one
// in mode CSR whose certificate the operator signs as
// hookwright.io/webhook-serving. No admission fails while the new CA is
// staged, published into every caBundle and the signer's
// ClusterTrustBundle, promoted, and the SelfSigned certificate re-issued
// and then served by the server pods (after the kubelet updates their
// mounted Secret). The old CA leaves after the drain grace (5 min by
// default), which the demo does not wait for; test/operator measures it
// with a short grace.
func Rotation(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster.Client
	sample := &v1alpha1.SidecarInjector{}
	if err := c.Get(ctx, client.ObjectKey{Name: SampleInjectorName}, sample); err != nil {
		return err
	}
	sel := map[string]string{"hookwright-demo/certificate": "csr"}
	if _, err := e.Cluster.CreateNamespace(ctx, csrNamespace, sel); err != nil {
		return err
	}
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: csrInjectorName}, Spec: *sample.Spec.DeepCopy()}
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: sel}
	si.Spec.Certificate = v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateCSR, CSR: &v1alpha1.CSRCertificate{SignerName: operatorSigner, Approve: true}}
	start := time.Now()
	if err := c.Create(ctx, si); err != nil {
		return err
	}
	if err := cluster.WaitFor(ctx, 2*time.Minute, "SidecarInjector "+csrInjectorName+" Ready", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(si), si)
		return err == nil && apimeta.IsStatusConditionTrue(si.Status.Conditions, v1alpha1.ConditionReady), err
	}); err != nil {
		return err
	}
	if _, err := cluster.Poll(ctx, 5*time.Millisecond, 30*time.Second, "dry-run pod in "+csrNamespace+" injected", func(ctx context.Context) (bool, error) {
		p, err := dryRunIn(ctx, e, csrNamespace, "csr-1")
		return err == nil && injectedOnce(p) == nil, nil
	}); err != nil {
		return err
	}
	r.timing("SidecarInjector in mode CSR created → Ready, pods injected", time.Since(start), 0)
	r.check("SidecarInjector %s (mode CSR, signer %s, approve: true) injects pods in %s beside the SelfSigned sample", csrInjectorName, operatorSigner, csrNamespace)

	took, err := cluster.Poll(ctx, 50*time.Millisecond, 3*time.Minute, "WebhookReachable True on both injectors", func(ctx context.Context) (bool, error) {
		for _, name := range []string{SampleInjectorName, csrInjectorName} {
			o := &v1alpha1.SidecarInjector{}
			if err := c.Get(ctx, client.ObjectKey{Name: name}, o); err != nil {
				return false, err
			}
			if !apimeta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionWebhookReachable) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	r.check("WebhookReachable True on both injectors (the operator's dry-run probe through the API server; %s after the CSR injector was Ready)", took.Round(time.Millisecond))

	caKey := client.ObjectKey{Namespace: OperatorNamespace, Name: desired.CASecretName}
	caSec := &corev1.Secret{}
	if err := c.Get(ctx, caKey, caSec); err != nil {
		return err
	}
	oldCA, err := pki.ParseCertPEM(caSec.Data[pki.SecretKeyActiveCert])
	if err != nil {
		return fmt.Errorf("CA Secret %s: %w", caKey, err)
	}

	// The load: 50 creates per second, alternating between the two.
	loads := []*admissionLoad{{ns: LabNamespace}, {ns: csrNamespace}}
	stopLoad := startAdmissionLoad(ctx, c, loads, rotationLoad, rotationInflight, "rotation-")
	defer stopLoad()
	loadCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	// WebhookReachable of both injectors in every version the API server
	// stores from here on: a watch, so no write is missed however slowly
	// this process runs (a poll of a starved API server sees a few).
	var versions, unreachable atomic.Int64
	var lastBad atomic.Value
	observe := func(o *v1alpha1.SidecarInjector) {
		if o.Name != SampleInjectorName && o.Name != csrInjectorName {
			return
		}
		versions.Add(1)
		if cond := apimeta.FindStatusCondition(o.Status.Conditions, v1alpha1.ConditionWebhookReachable); cond == nil || cond.Status != metav1.ConditionTrue {
			unreachable.Add(1)
			lastBad.Store(fmt.Sprintf("%s: %+v", o.Name, cond))
		}
	}
	wc, err := client.NewWithWatch(e.Cluster.Config, client.Options{Scheme: e.Cluster.Scheme})
	if err != nil {
		return err
	}
	var sis v1alpha1.SidecarInjectorList
	if err := c.List(ctx, &sis); err != nil {
		return err
	}
	for i := range sis.Items {
		observe(&sis.Items[i])
	}
	watchErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := cluster.Watch(loadCtx, 24*time.Hour, "SidecarInjector writes", sis.ResourceVersion, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return wc.Watch(ctx, &v1alpha1.SidecarInjectorList{}, &client.ListOptions{Raw: &o})
		}, func(ev watch.Event) (bool, error) {
			if o, ok := ev.Object.(*v1alpha1.SidecarInjector); ok {
				observe(o)
			}
			return false, nil
		})
		if loadCtx.Err() == nil {
			watchErr <- err
		}
	}()
	// A baseline before rotating: admissions counted, not seconds (what
	// 2 s make on an idle machine).
	if err := awaitAdmissions(ctx, loads, rotationBaseline, "before rotating"); err != nil {
		return err
	}

	token := time.Now().UTC().Format(time.RFC3339)
	if _, _, err := e.RunKubectl(ctx, nil, "-n", OperatorNamespace, "annotate", "secret", desired.CASecretName,
		v1alpha1.AnnotationRotateCA+"="+token, "--overwrite"); err != nil {
		return err
	}
	asked := time.Now()
	r.check("kubectl -n %s annotate secret %s %s=%s (what `hookwright rotate-ca` writes)", OperatorNamespace, desired.CASecretName, v1alpha1.AnnotationRotateCA, token)

	var next *x509.Certificate
	took, err = cluster.Poll(ctx, 5*time.Millisecond, 3*time.Minute, "next CA staged", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, caKey, caSec); err != nil {
			return false, err
		}
		next, err = pki.ParseCertPEM(caSec.Data[pki.SecretKeyNextCert])
		return err == nil, nil
	})
	if err != nil {
		return err
	}
	r.timing("rotate-ca → next CA staged in the CA Secret", took, 0)
	if _, err := cluster.Poll(ctx, 5*time.Millisecond, 3*time.Minute, "next CA in every caBundle and the ClusterTrustBundle", func(ctx context.Context) (bool, error) {
		configs, err := ownedConfigs(ctx, e)
		if err != nil || len(configs) == 0 {
			return false, err
		}
		for _, m := range configs {
			for _, w := range m.Webhooks {
				if !pki.BundleContains(w.ClientConfig.CABundle, next) {
					return false, nil
				}
			}
		}
		return trustBundleHas(ctx, c, operatorSigner, next)
	}); err != nil {
		return err
	}
	r.timing("rotate-ca → next CA in every caBundle (SelfSigned and CSR) and the ClusterTrustBundle", time.Since(asked), 0)
	if _, err := cluster.Poll(ctx, 5*time.Millisecond, 3*time.Minute, "next CA promoted", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, caKey, caSec); err != nil {
			return false, err
		}
		active, err := pki.ParseCertPEM(caSec.Data[pki.SecretKeyActiveCert])
		return err == nil && active.Equal(next), nil
	}); err != nil {
		return err
	}
	r.timing("rotate-ca → next CA promoted (signs from now on)", time.Since(asked), 0)
	servingKey := client.ObjectKey{Namespace: OperatorNamespace, Name: desired.ServingSecretName(desired.SidecarCR(sample))}
	if _, err := cluster.Poll(ctx, 5*time.Millisecond, 3*time.Minute, "SelfSigned serving certificate from the new CA", func(ctx context.Context) (bool, error) {
		sec := &corev1.Secret{}
		if err := c.Get(ctx, servingKey, sec); err != nil {
			return false, err
		}
		leaf, err := pki.ParseCertPEM(sec.Data[corev1.TLSCertKey])
		return err == nil && pki.SignedBy(leaf, next), nil
	}); err != nil {
		return err
	}
	r.timing("rotate-ca → SelfSigned serving certificate re-issued from the new CA", time.Since(asked), 0)
	// A TLS handshake with each pod per poll: 200 ms keeps the kubelet's
	// Secret update (a pod sync away) from costing the servers CPU.
	if _, err := cluster.Poll(ctx, 200*time.Millisecond, 4*time.Minute, "the sample's server pods serve the new certificate", func(ctx context.Context) (bool, error) {
		return podsServe(ctx, c, desired.SidecarCR(sample).Base(), next)
	}); err != nil {
		return err
	}
	r.timing("rotate-ca → every sample server pod serves it (the kubelet's Secret update, certwatcher)", time.Since(asked), 0)
	// Admissions against the new certificate, counted.
	if err := awaitAdmissions(ctx, loads, rotationBaseline, "against the new certificate"); err != nil {
		return err
	}
	skipped := stopLoad()
	stop()
	wg.Wait()
	select {
	case err := <-watchErr:
		return fmt.Errorf("the watch of WebhookReachable ended early: %w", err)
	default:
	}

	var failed int64
	for _, l := range loads {
		failed += l.failed.Load() + l.uninjected.Load()
		r.check("%s: %d dry-run creates during the rotation, %d failed, %d not injected%s", l.ns, l.attempted.Load(), l.failed.Load(), l.uninjected.Load(), firstErrors(l))
	}
	if n := skipped; n > 0 {
		r.check("%d ticks of the %d/s load skipped with %d creates in flight (the machine held less)", n, rotationLoad, rotationInflight)
	}
	if failed > 0 {
		for _, c := range e.Cluster.Egress.Cut() {
			r.check("egress relay cut by its target: %s", c)
		}
		return fmt.Errorf("%d admissions failed or were not injected during the CA rotation", failed)
	}
	if n := unreachable.Load(); n > 0 {
		return fmt.Errorf("WebhookReachable not True in %d of %d stored versions of the two injectors during the rotation (last %v)", n, versions.Load(), lastBad.Load())
	}
	r.check("WebhookReachable True in all %d stored versions of both injectors during the rotation (a watch: every write seen)", versions.Load())
	r.check("old CA %q stays trusted until the drain grace ends (5 min by default; not waited for here)", oldCA.Subject.CommonName)
	return nil
}

// awaitAdmissions waits until every load has recorded n more dry-run
// creates than when it was called.
func awaitAdmissions(ctx context.Context, loads []*admissionLoad, n int64, what string) error {
	base := make([]int64, len(loads))
	for i, l := range loads {
		base[i] = l.attempted.Load()
	}
	var last string
	// Minutes, not the seconds it takes idle: a starved API server
	// answers a create every few seconds.
	if err := cluster.WaitFor(ctx, 5*time.Minute, fmt.Sprintf("%d admissions per namespace %s", n, what), func(context.Context) (bool, error) {
		ok := true
		last = ""
		for i, l := range loads {
			got := l.attempted.Load() - base[i]
			last += fmt.Sprintf("%s: %d ", l.ns, got)
			ok = ok && got >= n
		}
		return ok, nil
	}); err != nil {
		return fmt.Errorf("%w (%s)", err, strings.TrimSpace(last))
	}
	return nil
}

func firstErrors(l *admissionLoad) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.firstErrs) == 0 {
		return ""
	}
	return fmt.Sprintf(" (first errors %v)", l.firstErrs)
}

// dryRunIn creates pod name in ns as a server-side dry run.
func dryRunIn(ctx context.Context, e *Env, ns, name string) (*corev1.Pod, error) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: nginx}}},
	}
	if err := e.Cluster.Client.Create(ctx, p, client.DryRunAll); err != nil {
		return nil, err
	}
	return p, nil
}

// trustBundleHas reports whether a ClusterTrustBundle of signer holds ca.
func trustBundleHas(ctx context.Context, c client.Client, signer string, ca *x509.Certificate) (bool, error) {
	var l certificatesv1.ClusterTrustBundleList
	if err := c.List(ctx, &l); err != nil {
		return false, err
	}
	for _, b := range l.Items {
		if b.Spec.SignerName == signer && pki.BundleContains([]byte(b.Spec.TrustBundle), ca) {
			return true, nil
		}
	}
	return false, nil
}

// podsServe reports whether every ready server pod of base presents a
// certificate signed by ca on its webhook port (pod IPs are routed to the
// node's bridge on this machine only).
func podsServe(ctx context.Context, c client.Client, base string, ca *x509.Certificate) (bool, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(OperatorNamespace), client.MatchingLabels{desired.LabelInstance: base}); err != nil {
		return false, err
	}
	n := 0
	for _, p := range pods.Items {
		if !cluster.PodReady(&p) || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		n++
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: &tls.Config{InsecureSkipVerify: true}} // #nosec G402 -- only the presented chain is inspected
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(desired.WebhookPort)))
		if err != nil {
			return false, nil
		}
		chain := conn.(*tls.Conn).ConnectionState().PeerCertificates
		_ = conn.Close()
		if len(chain) == 0 || !pki.SignedBy(chain[0], ca) {
			return false, nil
		}
	}
	return n > 0, nil
}
