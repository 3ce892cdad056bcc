package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// These tests run a Roller on controller-runtime's fake client: the
// rollout's own logic (what it reads, decides and writes, in which order),
// not the API server's behaviour, which test/operator's rollout tests
// check against a real one.

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// inject is the namespace label the test CR selects.
var inject = map[string]map[string]string{"apps": {"inject": "on"}}

const proxyTemplate = "spec:\n  containers:\n  - name: proxy\n    image: {{ .Values.image | quote }}\n"

// testCR is a Ready SidecarInjector adding the proxy with image, rolling
// out with strategy and maxUnavailable.
func testCR(image string, strategy v1alpha1.RolloutStrategy, maxUnavailable int) *v1alpha1.SidecarInjector {
	cr := &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh", Generation: 1},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"inject": "on"}},
			DefaultTemplates:  []string{"proxy"},
			Values:            &apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf(`{"image":%q}`, image))},
			Templates:         []v1alpha1.NamedTemplate{{Name: "proxy", Template: proxyTemplate}},
			Rollout:           v1alpha1.RolloutSpec{Strategy: strategy, MaxUnavailable: ptr.To(intstr.FromInt32(int32(maxUnavailable)))},
		},
	}
	cr.Default()
	cr.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.NewTime(t0)}}
	return cr
}

func injectorOf(t *testing.T, cr *v1alpha1.SidecarInjector) fleet.Injector {
	t.Helper()
	inj, err := fleet.NewInjector(cr, desired.Settings{Namespace: "hookwright-system"}, "v1.33.0")
	if err != nil {
		t.Fatal(err)
	}
	return inj
}

// env is a Roller on a fake cluster, and the fleet reconcile around it.
type env struct {
	t   *testing.T
	c   client.WithWatch
	r   *Roller
	rec *events.FakeRecorder
	now time.Time
	inj fleet.Injector
	// pods are what the pod index would hand the step.
	pods []Pod
	// writes are the writes in order: "status mesh", "restart
	// Deployment/apps/a", "patch pod apps/a-0".
	writes []string
	// failStatus fails the write-ahead; failPDBList the PDB lists;
	// denied the rights the SelfSubjectAccessReviews deny.
	failStatus, failPDBList bool
	denied                  []string
	// onRestart runs before an owner's restart reaches the server;
	// failRestart fails the restart as an unavailable API server would.
	onRestart   func()
	failRestart bool
}

func newEnv(t *testing.T, cr *v1alpha1.SidecarInjector, objs ...client.Object) *env {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, now: t0, inj: injectorOf(t, cr), rec: events.NewFakeRecorder(100)}
	e.c = fake.NewClientBuilder().WithScheme(s).WithObjects(append(objs, cr)...).
		WithStatusSubresource(&v1alpha1.SidecarInjector{}, &appsv1.Deployment{}).
		WithInterceptorFuncs(interceptor.Funcs{Create: e.create, Patch: e.patch, SubResourceApply: e.statusApply, List: e.list}).Build()
	e.restartOperator()
	return e
}

// restartOperator is a new leader: a new Roller, nothing remembered.
func (e *env) restartOperator() {
	e.r = New(e.c, e.c, e.rec, nil)
	e.r.now = func() time.Time { return e.now }
}

// create answers SelfSubjectAccessReviews as RBAC would.
func (e *env) create(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
	if rev, ok := obj.(*authorizationv1.SelfSubjectAccessReview); ok {
		a := rev.Spec.ResourceAttributes
		rev.Status.Allowed = !slices.Contains(e.denied, a.Verb+" "+a.Resource)
		return nil
	}
	return c.Create(ctx, obj, opts...)
}

func (e *env) patch(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	switch obj.(type) {
	case *appsv1.Deployment, *appsv1.StatefulSet, *appsv1.DaemonSet:
		w, _ := e.kindOf(obj)
		e.writes = append(e.writes, "restart "+w+"/"+obj.GetNamespace()+"/"+obj.GetName())
		if e.onRestart != nil {
			e.onRestart()
		}
		// A step whose context ended (onRestart may end it) writes nothing.
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.failRestart {
			return fmt.Errorf("etcdserver: request timed out")
		}
	case *corev1.Pod:
		e.writes = append(e.writes, "patch pod "+obj.GetNamespace()+"/"+obj.GetName())
	}
	return c.Patch(ctx, obj, p, opts...)
}

func (e *env) kindOf(obj client.Object) (string, bool) {
	for _, w := range workloads {
		if reflect.TypeOf(w.new()) == reflect.TypeOf(obj) {
			return w.kind, true
		}
	}
	return "", false
}

// statusApply records a SidecarInjector's status write (the write-ahead
// applies its share, rollout.Status).
func (e *env) statusApply(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	u, ok := obj.(interface {
		GetKind() string
		GetName() string
	})
	if ok && u.GetKind() == "SidecarInjector" && sub == "status" {
		e.writes = append(e.writes, "status "+u.GetName())
		if e.failStatus {
			return fmt.Errorf("etcdserver: request timed out")
		}
	}
	return c.SubResource(sub).Apply(ctx, obj, opts...)
}

func (e *env) list(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
	if _, ok := l.(*policyv1.PodDisruptionBudgetList); ok && e.failPDBList {
		return fmt.Errorf("poddisruptionbudgets is forbidden")
	}
	return c.List(ctx, l, opts...)
}

// step runs one fleet reconcile: the CR as the cache has it, one Step,
// then the status write on top of the step's write-ahead (an Update,
// not in e.writes, which has the step's own writes).
func (e *env) step() *v1alpha1.SidecarInjector {
	e.t.Helper()
	cr := e.cr()
	_, rv := e.r.Step(context.Background(), cr, e.inj, len(e.pods), e.pods, inject)
	if rv != "" {
		cr.ResourceVersion = rv
	}
	if err := e.c.Status().Update(context.Background(), cr); err != nil {
		e.t.Fatalf("status write after the step: %v", err)
	}
	return cr
}

func (e *env) cr() *v1alpha1.SidecarInjector {
	e.t.Helper()
	cr := &v1alpha1.SidecarInjector{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Name: "mesh"}, cr); err != nil {
		e.t.Fatal(err)
	}
	cr.Default()
	return cr
}

// deployment is Deployment name in apps with one pod (name-0, through
// ReplicaSet name-rs), rolled out and available; the pod lacks the
// sidecars (Missing).
func deployment(name string) (*appsv1.Deployment, *appsv1.ReplicaSet, *corev1.Pod) {
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name, Generation: 1, UID: types.UID("d-" + name)},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}}},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1, ReadyReplicas: 1},
	}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name + "-rs", UID: types.UID("rs-" + name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: name, UID: d.UID, Controller: ptr.To(true)}}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: name + "-0", UID: types.UID("p-" + name), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	return d, rs, pod
}

// deployments are deployment's objects for each name, and their pods as
// the index hands them (Missing).
func deployments(names ...string) ([]client.Object, []Pod) {
	var objs []client.Object
	var pods []Pod
	for _, n := range names {
		d, rs, pod := deployment(n)
		objs = append(objs, d, rs, pod)
		pods = append(pods, Pod{Pod: pod.DeepCopy(), Class: fleet.Pod{Namespace: "apps", Name: pod.Name, State: fleet.Missing}})
	}
	return objs, pods
}

// injectedPod runs the real engine on pod, as the webhook would have.
func injectedPod(t *testing.T, inj fleet.Injector, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	raw, _ := json.Marshal(pod)
	res, err := sidecar.Inject(inj.Config, inj.Params, sidecar.Input{Raw: raw, Namespace: pod.Namespace, WantJSON: true})
	if err != nil || !res.Injected {
		t.Fatalf("inject %s: %v %+v", pod.Name, err, res)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(res.JSON, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// rolling are the Deployments restarted for rev that have not rolled out
// (fleet.OwnerProgress), as the API server has them.
func (e *env) rolling(rev string) []string {
	e.t.Helper()
	var l appsv1.DeploymentList
	if err := e.c.List(context.Background(), &l); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for i := range l.Items {
		d := &l.Items[i]
		if done, _ := fleet.OwnerProgress(d); d.Annotations[v1alpha1.SidecarRestartedForKey] == rev && !done {
			out = append(out, d.Name)
		}
	}
	return out
}

// restarted are the owners restarted, in order, from e.writes.
func (e *env) restarted() []string {
	var out []string
	for _, w := range e.writes {
		if id, ok := strings.CutPrefix(w, "restart "); ok {
			out = append(out, id)
		}
	}
	return out
}

func (e *env) deployment(name string) *appsv1.Deployment {
	e.t.Helper()
	d := &appsv1.Deployment{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: "apps", Name: name}, d); err != nil {
		e.t.Fatal(err)
	}
	return d
}

// startRolling does what the Deployment controller does on a restart:
// the Deployment is rolling until rolledOut.
func (e *env) startRolling(name string) {
	e.t.Helper()
	d := &appsv1.Deployment{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: "apps", Name: name}, d); err != nil {
		e.t.Fatal(err)
	}
	d.Status.UpdatedReplicas = 0
	if err := e.c.Status().Update(context.Background(), d); err != nil {
		e.t.Fatal(err)
	}
}

// rolledOut finishes name's rollout: its new pod carries the revision.
func (e *env) rolledOut(name string) {
	e.t.Helper()
	d := &appsv1.Deployment{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: "apps", Name: name}, d); err != nil {
		e.t.Fatal(err)
	}
	d.Status.UpdatedReplicas = 1
	if err := e.c.Status().Update(context.Background(), d); err != nil {
		e.t.Fatal(err)
	}
	for i := range e.pods {
		if e.pods[i].Pod.Name == name+"-0" {
			e.pods[i].Class.State = fleet.Current
		}
	}
}

func condition(cr *v1alpha1.SidecarInjector, typ string) metav1.Condition {
	if c := apimeta.FindStatusCondition(cr.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{Type: typ, Status: "absent"}
}
