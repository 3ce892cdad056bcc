package node

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/test/cluster"
)

func mustCreate(ctx context.Context, t *testing.T, objs ...interface {
	GetName() string
}) {
	t.Helper()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = env.Clientset.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = env.Clientset.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = env.Clientset.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = env.Clientset.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			t.Cleanup(func() {
				_ = env.Clientset.RbacV1().ClusterRoles().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
			})
		case *rbacv1.ClusterRoleBinding:
			_, err = env.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			t.Cleanup(func() {
				_ = env.Clientset.RbacV1().ClusterRoleBindings().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
			})
		case *corev1.Secret:
			_, err = env.Clientset.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Service:
			_, err = env.Clientset.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = env.Clientset.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("mustCreate: unhandled %T", o)
		}
		if err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// A pod on the real node reaches the API server as in any cluster: client-go's
// rest.InClusterConfig (the kubernetes Service's ClusterIP, the projected
// ServiceAccount token, kube-root-ca.crt) verifies the serving certificate
// for the Service's IP, and RBAC grants exactly its ServiceAccount's Role.
// Its output is read through the API server (pods/log: the API server's
// client certificate against the kubelet's serving certificate).
func TestInClusterClientGetsItsServiceAccountsRBAC(t *testing.T) {
	ctx := cluster.TestContext(t, 4*time.Minute)
	ns := "incluster"
	createNS(ctx, t, ns)
	mustCreate(ctx, t,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reader"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-configmaps"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-configmaps"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "reader", Namespace: ns}}},
	)
	pod := hardenedPod(ns, "client", nil, "api",
		"/api/v1/namespaces/"+ns+"/configmaps", "200",
		"/api/v1/namespaces/"+ns+"/secrets", "403",
		"/api/v1/namespaces/default/configmaps", "403")
	pod.Spec.ServiceAccountName = "reader"
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Containers[0].Ports = nil
	mustCreate(ctx, t, pod)
	p := waitPod(ctx, t, ns, "client", "finished", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	if p.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("client pod %s: %+v\nits log:\n%s", p.Status.Phase, p.Status.ContainerStatuses, podLog(ctx, p))
	}
	// The kubelet's answer through the API server, as `kubectl logs` reads it.
	b, err := env.Clientset.CoreV1().Pods(ns).GetLogs("client", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pods/log through the API server: %v\nAPI server log tail:\n%s", err, tail(filepath.Join(env.Dir, "logs", "kube-apiserver.log"), 3000))
	}
	logs := string(b)
	svcIP := kubernetesServiceIP(ctx, t)
	for _, want := range []string{
		"GET https://" + net.JoinHostPort(svcIP, "443") + "/api/v1/namespaces/" + ns + "/configmaps: 200",
		`"name":"kube-root-ca.crt"`,
		"/api/v1/namespaces/" + ns + "/secrets: 403",
		`User \"system:serviceaccount:` + ns + `:reader\" cannot list resource \"secrets\"`,
		"/api/v1/namespaces/default/configmaps: 403",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("client log lacks %q:\n%s", want, logs)
		}
	}
}

func kubernetesServiceIP(ctx context.Context, t *testing.T) string {
	t.Helper()
	svc, err := env.Clientset.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// The API server calls a webhook served by a pod: `hookwright injector`
// from the operator image (pulled from the test's registry) in a real
// container behind a Service, with its serving certificate from a Secret
// volume. The API server's CONNECT for the Service's ClusterIP is dialled
// from inside the node's namespace, so kube-proxy picks the pod; nothing maps
// it to a local process.
func TestAPIServerCallsAWebhookInAPod(t *testing.T) {
	ctx := cluster.TestContext(t, 8*time.Minute)
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	imgs, err := ociimage.Build(ctx, ociimage.Options{Root: root, BinDir: t.TempDir()}, ociimage.SetOperator)
	if err != nil {
		t.Fatal(err)
	}
	image := registryHost + "/hookwright:node-test"
	var pushed bool
	for _, img := range imgs {
		if img.Name == ociimage.OperatorName {
			if err := ociimage.Push(ctx, registryAddr, ociimage.Named{Name: image, Image: img.Image}); err != nil {
				t.Fatal(err)
			}
			pushed = true
		}
	}
	if !pushed {
		t.Fatalf("ociimage.Build made no %s: %v", ociimage.OperatorName, imgs)
	}
	t.Logf("figure: operator image built and pushed in %s", time.Since(start).Round(time.Millisecond))

	const ns, name, injector = "hook", "injector", "node-injector"
	createNS(ctx, t, ns)
	si := cluster.SampleInjector(t, injector)
	if err := env.Client.Create(ctx, si); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), si) })
	ca, crt, key := cluster.MustServiceCA(t, "node-injector-ca", ns, name)
	// What the operator gives a server: its own ServiceAccount allowed to
	// read its SidecarInjector (controllers/desired.go).
	mustCreate(ctx, t,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "hw-node-" + name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"sidecarinjectors"}, Verbs: []string{"get", "list", "watch"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "hw-node-" + name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "hw-node-" + name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-tls"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("webhook")}},
		}},
	)
	pod := hardenedPod(ns, name, map[string]string{"app": name}, "injector", "--injector="+injector,
		"--operator-namespace="+ns, "--cert-dir=/certs", "--webhook-port=9443",
		"--health-probe-bind-address=:8081", "--metrics-bind-address=0")
	pod.Spec.ServiceAccountName = name
	ctr := &pod.Spec.Containers[0]
	ctr.Name = "server"
	ctr.Image, ctr.ImagePullPolicy = image, corev1.PullIfNotPresent
	ctr.Ports = []corev1.ContainerPort{{Name: "webhook", ContainerPort: 9443}, {Name: "probes", ContainerPort: 8081}}
	ctr.ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("probes")}},
		PeriodSeconds: 1,
	}
	ctr.VolumeMounts = []corev1.VolumeMount{{Name: "serving-cert", MountPath: "/certs", ReadOnly: true}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "serving-cert", VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: name + "-tls"}}}}
	created := time.Now()
	mustCreate(ctx, t, pod)
	var scheduled time.Time
	p := waitPod(ctx, t, ns, name, "Ready", func(p *corev1.Pod) bool {
		if scheduled.IsZero() && p.Spec.NodeName != "" {
			scheduled = time.Now()
		}
		if p.Status.Phase == corev1.PodFailed {
			return true
		}
		return cluster.PodReady(p)
	})
	if !cluster.PodReady(p) {
		t.Fatalf("injector pod failed: %+v\nits log:\n%s", p.Status, podLog(ctx, p))
	}
	t.Logf("figure: injector pod created -> scheduled %s, scheduled -> Ready %s",
		scheduled.Sub(created).Round(time.Millisecond), time.Since(scheduled).Round(time.Millisecond))

	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "hw-node-" + name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "inject.node.hookwright.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Path: ptr.To("/inject"), Port: ptr.To[int32](443)},
				CABundle: ca.CertPEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"hw-node-inject": "on"}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
	if err := env.Client.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mwc) })

	svc, err := env.Clientset.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(svc.Spec.ClusterIP, "443")
	if _, err := env.CreateNamespace(ctx, "hooked", map[string]string{"hw-node-inject": "on"}); err != nil {
		t.Fatal(err)
	}
	app := hardenedPod("hooked", "app", nil)
	var injected *corev1.Pod
	var last error
	// The webhook configuration and the Service's endpoint reach the API
	// server and kube-proxy a moment after they are written: failurePolicy
	// Fail refuses the pod until then.
	if err := cluster.WaitFor(ctx, time.Minute, "pod injected through "+target, func(ctx context.Context) (bool, error) {
		out, err := env.Clientset.CoreV1().Pods("hooked").Create(ctx, app.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsInternalError(err) || err != nil && strings.Contains(err.Error(), "failed calling webhook") {
			last = err
			return false, nil
		}
		if err != nil {
			return false, cluster.Permanent(err)
		}
		injected = out
		return true, nil
	}); err != nil {
		t.Fatalf("%v: %v (%d CONNECTs)\nAPI server log tail:\n%s", err, last, env.Egress.Hits(target), tail(filepath.Join(env.Dir, "logs", "kube-apiserver.log"), 3000))
	}
	var names []string
	for _, c := range injected.Spec.InitContainers {
		names = append(names, c.Name)
	}
	if len(names) != 2 || names[0] != "proxy-init" || names[1] != "proxy" {
		t.Errorf("injected init containers %v, want [proxy-init proxy]", names)
	}
	if injected.Annotations["sidecar.hookwright.io/status"] == "" {
		t.Errorf("injected pod has no sidecar.hookwright.io/status annotation: %v", injected.Annotations)
	}
	if hits := env.Egress.Hits(target); hits == 0 {
		t.Errorf("the API server never sent a CONNECT for %s", target)
	}
	t.Logf("API server CONNECTs to the injector's Service %s: %d", target, env.Egress.Hits(target))
}
