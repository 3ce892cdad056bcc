package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/test/cluster"
)

// webhookServer is a hookwright webhook server (injector or oversell) run
// as the operator runs it: a pod on the package's real node from the
// operator image, its serving certificate for the Service's DNS names in a
// Secret volume (mode 0440, fsGroup), its own ServiceAccount allowed to read
// the hookwright kinds, behind Service <namespace>/<name> (port 443 to the
// pod's 9443), which the API server reaches through kube-proxy.
type webhookServer struct {
	name, namespace string
	ca              *cluster.TestCA
	pod             *corev1.Pod // what start creates
	podIP, cid      string
}

// Addr is the pod's HTTPS listener (the host routes the node's pod range).
func (s *webhookServer) Addr() string { return net.JoinHostPort(s.podIP, "9443") }

// serverTaint keeps every other pod off the real node.
const serverTaint = "hookwright.io/it-servers"

// atExit runs in TestMain after the tests: cleanups of shared servers.
var atExit []func()

// startWebhookServer starts a server; shared ones outlive the calling test
// and are stopped after all tests.
func startWebhookServer(t *testing.T, shared bool, subcommand, namespace, service string, extra ...string) *webhookServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := env.CreateNamespace(ctx, namespace, nil); err != nil && !apierrors.IsAlreadyExists(errors.Unwrap(err)) {
		t.Fatal(err)
	}
	ca, crt, key := cluster.MustServiceCA(t, service+"-ca", namespace, service)
	s := &webhookServer{name: service, namespace: namespace, ca: ca}
	role := "hw-it-" + namespace + "-" + service
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: service + "-tls"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: service}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"admission.hookwright.io"}, Resources: []string{"sidecarinjectors", "nodeoversells"}, Verbs: []string{"get", "list", "watch"},
		}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: service, Namespace: namespace}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: service}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"hw-it-server": service},
			Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("webhook")}},
		}},
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	s.pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: service, Labels: map[string]string{"hw-it-server": service}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node.Name},
			Tolerations:                   []corev1.Toleration{{Key: serverTaint, Operator: corev1.TolerationOpExists}},
			ServiceAccountName:            service,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				FSGroup:        ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "server",
				Image: serverImage,
				Args: append([]string{subcommand, "--webhook-port=9443", "--cert-dir=/certs",
					"--metrics-bind-address=0", "--health-probe-bind-address=:8081"}, extra...),
				Env: []corev1.EnvVar{{Name: "POD_NAMESPACE", Value: namespace}},
				Ports: []corev1.ContainerPort{
					{Name: "webhook", ContainerPort: 9443}, {Name: "probes", ContainerPort: 8081},
				},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("probes")}},
					PeriodSeconds: 1,
				},
				SecurityContext: &corev1.SecurityContext{
					ReadOnlyRootFilesystem:   ptr.To(true),
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "serving-cert", MountPath: "/certs", ReadOnly: true}},
				// The operator's default server resources (controllers'
				// DefaultResources): the 256Mi memory limit is real here.
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
			}},
			Volumes: []corev1.Volume{{Name: "serving-cert", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: service + "-tls", DefaultMode: ptr.To[int32](0o440)}}}},
		},
	}
	s.start(t)
	stop := func() {
		s.stop()
		for _, o := range objs {
			_ = env.Client.Delete(context.Background(), o)
		}
	}
	if shared {
		atExit = append(atExit, stop)
	} else {
		t.Cleanup(stop)
	}
	return s
}

// start creates the server's pod and waits until it is Ready (its
// readiness probe passed) and its Service has the pod as a ready endpoint.
func (s *webhookServer) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := env.Client.Create(ctx, s.pod.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{}
	err := cluster.WaitFor(ctx, 3*time.Minute, "server pod "+s.namespace+"/"+s.name+" Ready and its endpoint ready", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s.pod), p); err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed {
			return false, cluster.Permanent(fmt.Errorf("pod failed: %+v", p.Status))
		}
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}
		if !ready {
			return false, nil
		}
		var slices discoveryv1.EndpointSliceList
		if err := env.Client.List(ctx, &slices, client.InNamespace(s.namespace), client.MatchingLabels{discoveryv1.LabelServiceName: s.name}); err != nil {
			return false, err
		}
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				if ptr.Deref(ep.Conditions.Ready, false) && slicesContains(ep.Addresses, p.Status.PodIP) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		b, _ := env.Clientset.CoreV1().Pods(s.namespace).GetLogs(s.name, &corev1.PodLogOptions{TailLines: ptr.To[int64](40)}).DoRaw(ctx)
		t.Fatalf("%v; pod status %+v\nlog:\n%s", err, p.Status, b)
	}
	s.podIP = p.Status.PodIP
	s.cid = strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
}

func slicesContains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// stop deletes the pod and waits until the kubelet has removed it (the
// Service stays, with no endpoint: calls are then refused).
func (s *webhookServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = env.Client.Delete(ctx, s.pod.DeepCopy(), client.GracePeriodSeconds(1))
	_ = cluster.WaitFor(ctx, 2*time.Minute, "server pod "+s.name+" gone", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(s.pod), &corev1.Pod{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// pid is the host pid of the server's container process.
func (s *webhookServer) pid(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid, err := node.TaskPID(ctx, s.cid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// configz GETs /configz from the server over verified TLS.
func (s *webhookServer) configz(into any) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.ca.CertPEM)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: s.name + ".svc", MinVersion: tls.VersionTLS12,
		// The certificate names <svc>.<ns>.svc; verify against the CA only.
		InsecureSkipVerify: true, //nolint:gosec // verified below with VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			cert, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			_, err = cert.Verify(x509.VerifyOptions{Roots: pool})
			return err
		},
	}}}
	res, err := c.Get("https://" + s.Addr() + "/configz")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("/configz: %s: %s", res.Status, b)
	}
	return json.Unmarshal(b, into)
}
