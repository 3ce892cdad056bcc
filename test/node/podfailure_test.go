package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// A server pod spec the real kubelet refuses surfaces on the CR as
// ServerPodsHealthy False with the kubelet's reason and message, and a
// False ServerAvailable names it, for four refusals of the operator's
// own pod spec (runAsNonRoot, every capability dropped, read-only root):
//   - an image whose user is a name: the kubelet cannot verify runAsNonRoot
//     (pkg/kubelet/kuberuntime/security_context_others.go, verifyRunAsNonRoot);
//   - an image the registry does not have: ErrImagePull, then ImagePullBackOff;
//   - an image whose program exits at once: CrashLoopBackOff, with the exit;
//   - a serving Secret (mode Secret) nobody wrote: the pod stays in
//     ContainerCreating and the kubelet's FailedMount Event says why.
func TestServerPodFailuresSurfaceOnTheCR(t *testing.T) {
	ctx := cluster.TestContext(t, 10*time.Minute)
	startOperator(t)
	pushOperatorImage(ctx, t)

	// The stand-in with its user given by name: runs as nonroot (65532)
	// from /etc/passwd in any runtime, but the kubelet checks runAsNonRoot
	// on the image's user before there is a process.
	img, err := pullableStandin(t)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	c.User = "nonroot"
	named, err := mutate.Config(img, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.Push(ctx, registryAddr, ociimage.Named{Name: registryHost + "/server:user-by-name", Image: named}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, image string
		// reasons the condition may carry on its way (the first pull
		// failure is ErrImagePull); want is the settled one.
		reasons []string
		want    string
		msg     []string
		// cert is the CR's certificate spec (default SelfSigned).
		cert v1alpha1.CertificateSpec
	}{
		{
			name: "user-by-name", image: registryHost + "/server:user-by-name",
			want: "CreateContainerConfigError",
			msg:  []string{"container server: CreateContainerConfigError: container has runAsNonRoot and image has non-numeric user (nonroot), cannot verify user is non-root"},
		},
		{
			name: "absent-image", image: registryHost + "/server:absent",
			reasons: []string{"ErrImagePull"}, want: "ImagePullBackOff",
			msg: []string{"container server: ImagePullBackOff: ", registryHost + "/server:absent"},
		},
		{
			// Mode Secret naming a Secret nobody wrote: the pod waits in
			// ContainerCreating, the reason only in the kubelet's Events.
			name: "missing-secret", image: serverImage,
			cert: v1alpha1.CertificateSpec{Mode: v1alpha1.CertificateSecret, SecretName: "never-written"},
			want: "FailedMount",
			msg:  []string{`MountVolume.SetUp failed for volume "serving-cert" : secret "never-written" not found`},
		},
		{
			// The stand-in takes its role from its first argument,
			// "sidecar" here (the operator's args), and knows none such.
			name: "crashing", image: ociimage.StandinName,
			reasons: []string{"Error"}, want: "CrashLoopBackOff",
			msg: []string{"container server: CrashLoopBackOff: back-off", "last exit code 2 (Error)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each case has its own CR, server pod and image: they wait
			// on the kubelet side by side.
			t.Parallel()
			si := &v1alpha1.SidecarInjector{
				ObjectMeta: metav1.ObjectMeta{Name: "refused-" + tc.name},
				Spec: v1alpha1.SidecarInjectorSpec{
					// No namespace carries the label: the webhook intercepts nothing.
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test.hookwright.io/nothing": tc.name}},
					Server:            v1alpha1.ServerSpec{Replicas: ptr.To[int32](1), Image: tc.image},
					Certificate:       tc.cert,
				},
			}
			created := time.Now()
			if err := env.Client.Create(ctx, si); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { deleteAndWait(t, si) })

			// When the kubelet first reports the settled reason on the pod,
			// and when the CR first names it.
			sel := client.MatchingLabels{desired.LabelInstance: desired.SidecarKind.BaseName(si.Name)}
			var podAt, crAt time.Time
			var cond *metav1.Condition
			err := cluster.WaitFor(ctx, 4*time.Minute, "pod reason "+tc.want+" on pod and CR", func(ctx context.Context) (bool, error) {
				if podAt.IsZero() {
					var pods corev1.PodList
					if err := env.Client.List(ctx, &pods, client.InNamespace(operatorNS), sel); err != nil {
						return false, err
					}
					for _, p := range pods.Items {
						for _, cs := range p.Status.ContainerStatuses {
							if w := cs.State.Waiting; w != nil && w.Reason == tc.want {
								podAt = time.Now()
							}
						}
						var evs corev1.EventList
						if err := env.Client.List(ctx, &evs, client.InNamespace(operatorNS), client.MatchingFields{"involvedObject.uid": string(p.UID)}); err == nil {
							for _, e := range evs.Items {
								if e.Reason == tc.want && podAt.IsZero() {
									podAt = time.Now()
								}
							}
						}
					}
				}
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
					return false, err
				}
				for i, c := range si.Status.Conditions {
					if c.Type == v1alpha1.ConditionServerPodsHealthy && c.Reason == tc.want && crAt.IsZero() {
						crAt, cond = time.Now(), &si.Status.Conditions[i]
					}
				}
				return !podAt.IsZero() && !crAt.IsZero(), nil
			})
			if err != nil {
				t.Fatalf("%v; CR conditions %+v", err, si.Status.Conditions)
			}
			if cond.Status != metav1.ConditionFalse {
				t.Errorf("%s = %s, want False", cond.Type, cond.Status)
			}
			for _, m := range tc.msg {
				if !strings.Contains(cond.Message, m) {
					t.Errorf("%s message %q lacks %q", cond.Type, cond.Message, m)
				}
			}
			lag := crAt.Sub(podAt)
			if lag < 0 {
				lag = 0 // seen on the CR in the same poll
			}
			t.Logf("figure: %s: CR created -> %s on the CR %s; kubelet's pod status -> CR condition %s (100 ms polls)",
				tc.name, tc.want, crAt.Sub(created).Round(time.Millisecond), lag.Round(time.Millisecond))

			// Ready leads to it: ServerAvailable False names the reason.
			for _, c := range si.Status.Conditions {
				switch c.Type {
				case v1alpha1.ConditionServerAvailable:
					if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, tc.want) {
						t.Errorf("ServerAvailable %s %q, want False naming %s", c.Status, c.Message, tc.want)
					}
				case v1alpha1.ConditionReady:
					if c.Status != metav1.ConditionFalse {
						t.Errorf("Ready %s, want False", c.Status)
					}
				}
			}
		})
	}
}

// deleteAndWait deletes a CR and waits until it and its server pods are
// gone (the garbage collector deletes the Deployment, then the pods).
func deleteAndWait(t *testing.T, obj client.Object) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := client.IgnoreNotFound(env.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationForeground))); err != nil {
		t.Errorf("delete %s: %v", obj.GetName(), err)
		return
	}
	var kind desired.Kind
	switch obj.(type) {
	case *v1alpha1.NodeOversell:
		kind = desired.OversellKind
	default:
		kind = desired.SidecarKind
	}
	sel := client.MatchingLabels{desired.LabelInstance: kind.BaseName(obj.GetName())}
	if err := cluster.WaitFor(ctx, 3*time.Minute, obj.GetName()+" and its pods gone", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if client.IgnoreNotFound(err) != nil {
			return false, err
		}
		gone := err != nil
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(operatorNS), sel); err != nil {
			return false, err
		}
		return gone && len(pods.Items) == 0, nil
	}); err != nil {
		t.Error(err)
	}
}
