package scenarios

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

const (
	// secondInjectorName is scenario 7's second SidecarInjector, a copy
	// of the sample selecting secondNamespace, so two injectors' servers
	// roll through the OLM upgrade.
	secondInjectorName = "second-injector"
	secondNamespace    = "lab-second"
	secondLabel        = "hookwright-demo/second"
)

// upgradeLoad is issue 25's OLM upgrade check, around scenario 7's make
// run-bundle-upgrade: 50 dry-run pod creates a second into the namespaces
// of two SidecarInjectors (Fail, two replicas each) while OLM replaces the
// operator and the new operator rolls every server Deployment to its
// image. Every create must be admitted and injected, and no two server
// Deployments may roll at once (controllers/serverrollout.go).
type upgradeLoad struct {
	loads     []*admissionLoad
	stopLoad  func() int64
	stopWatch context.CancelFunc
	watchErr  chan error
	image     string
	start     time.Time

	mu sync.Mutex
	// rolling maps each server Deployment whose template took image, and
	// whose rollout has not finished, to the generation it took it at.
	rolling  map[string]int64
	rolled   []string
	overlaps []string
}

// beginUpgradeLoad creates the second injector, waits until it injects,
// starts the watch of the server Deployments and the load, and returns
// once the load was admitted in both namespaces.
func (e *Env) beginUpgradeLoad(ctx context.Context, r *Result, image string) (*upgradeLoad, error) {
	c := e.Cluster.Client
	sample := &v1alpha1.SidecarInjector{}
	if err := c.Get(ctx, client.ObjectKey{Name: SampleInjectorName}, sample); err != nil {
		return nil, err
	}
	sel := map[string]string{secondLabel: "true"}
	if _, err := e.Cluster.CreateNamespace(ctx, secondNamespace, sel); err != nil {
		return nil, err
	}
	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: secondInjectorName}, Spec: *sample.Spec.DeepCopy()}
	si.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: sel}
	if err := createValidated(ctx, e.Cluster, si); err != nil {
		return nil, err
	}
	if err := cluster.WaitFor(ctx, 3*time.Minute, "SidecarInjector "+secondInjectorName+" Ready and reachable", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(si), si)
		return err == nil && apimeta.IsStatusConditionTrue(si.Status.Conditions, v1alpha1.ConditionReady) &&
			apimeta.IsStatusConditionTrue(si.Status.Conditions, v1alpha1.ConditionWebhookReachable), err
	}); err != nil {
		return nil, err
	}
	if err := cluster.WaitFor(ctx, time.Minute, "dry-run pod in "+secondNamespace+" injected", func(ctx context.Context) (bool, error) {
		p, err := dryRunIn(ctx, e, secondNamespace, "second-1")
		return err == nil && injectedOnce(p) == nil, nil
	}); err != nil {
		return nil, err
	}
	r.check("SidecarInjector %s (the sample's spec, failurePolicy %s, %d replicas) injects pods in %s beside the sample",
		secondInjectorName, sample.Spec.FailurePolicy, ptrValue(sample.Spec.Server.Replicas), secondNamespace)

	u := &upgradeLoad{image: image, rolling: map[string]int64{}, watchErr: make(chan error, 1)}
	wc, err := client.NewWithWatch(e.Cluster.Config, client.Options{Scheme: e.Cluster.Scheme})
	if err != nil {
		return nil, err
	}
	labels := serverLabels
	var list appsv1.DeploymentList
	if err := c.List(ctx, &list, labels); err != nil {
		return nil, err
	}
	for i := range list.Items {
		u.observe(&list.Items[i])
	}
	wctx, stop := context.WithCancel(ctx)
	u.stopWatch = stop
	go func() {
		err := cluster.Watch(wctx, 24*time.Hour, "server Deployments", list.ResourceVersion, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return wc.Watch(ctx, &appsv1.DeploymentList{}, &client.ListOptions{LabelSelector: k8slabels.SelectorFromSet(k8slabels.Set(labels)), Raw: &o})
		}, func(ev watch.Event) (bool, error) {
			if d, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type != watch.Deleted {
				u.observe(d)
			}
			return false, nil
		})
		if wctx.Err() == nil {
			u.watchErr <- err
		}
	}()
	u.loads = []*admissionLoad{{ns: LabNamespace}, {ns: secondNamespace}}
	u.stopLoad = startAdmissionLoad(ctx, c, u.loads, rotationLoad, rotationInflight, "upgrade-")
	u.start = time.Now()
	if err := awaitAdmissions(ctx, u.loads, rotationBaseline, "before the upgrade"); err != nil {
		u.stop()
		return nil, err
	}
	return u, nil
}

// serverLabels select every hookwright server Deployment.
var serverLabels = client.MatchingLabels{desired.LabelManagedBy: desired.ManagedByValue, desired.LabelComponent: "webhook-server"}

func ptrValue(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// observe follows one stored version of a server Deployment: the version
// whose template first names u.image starts its rollout, which must find
// no other rollout under way; the first version with every replica
// updated, available and no older one left ends it.
func (u *upgradeLoad) observe(d *appsv1.Deployment) {
	u.mu.Lock()
	defer u.mu.Unlock()
	cs := d.Spec.Template.Spec.Containers
	if len(cs) == 0 || cs[0].Image != u.image || slices.Contains(u.rolled, d.Name) {
		return
	}
	gen, ok := u.rolling[d.Name]
	if !ok {
		for other := range u.rolling {
			u.overlaps = append(u.overlaps, fmt.Sprintf("%s took %s while %s was rolling", d.Name, u.image, other))
		}
		gen = d.Generation
		u.rolling[d.Name] = gen
	}
	want := ptrValue(d.Spec.Replicas)
	s := d.Status
	if s.ObservedGeneration >= gen && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want {
		delete(u.rolling, d.Name)
		u.rolled = append(u.rolled, d.Name)
	}
}

func (u *upgradeLoad) stop() int64 {
	u.stopWatch()
	return u.stopLoad()
}

// finish waits until every server Deployment rolled to u.image, counts
// admissions after it, stops the load and judges it; then it deletes the
// second injector and its namespace.
func (e *Env) finishUpgradeLoad(ctx context.Context, r *Result, u *upgradeLoad) error {
	defer u.stop()
	c := e.Cluster.Client
	var servers []string
	err := cluster.WaitFor(ctx, 10*time.Minute, "every server Deployment rolled to "+u.image, func(ctx context.Context) (bool, error) {
		var list appsv1.DeploymentList
		if err := c.List(ctx, &list, serverLabels); err != nil {
			return false, err
		}
		servers = servers[:0]
		for _, d := range list.Items {
			servers = append(servers, d.Name)
		}
		u.mu.Lock()
		defer u.mu.Unlock()
		return len(servers) >= 3 && len(u.rolled) == len(servers), nil
	})
	if err != nil {
		u.mu.Lock()
		defer u.mu.Unlock()
		return fmt.Errorf("%w (servers %v, rolled %v, rolling %v)", err, servers, u.rolled, u.rolling)
	}
	r.timing("make run-bundle-upgrade started → every server Deployment rolled to "+u.image, time.Since(u.start), 0)
	if err := awaitAdmissions(ctx, u.loads, rotationBaseline, "after the upgrade"); err != nil {
		return err
	}
	skipped := u.stop()
	select {
	case err := <-u.watchErr:
		return fmt.Errorf("the watch of the server Deployments ended early: %w", err)
	default:
	}
	var failed int64
	for _, l := range u.loads {
		failed += l.failed.Load() + l.uninjected.Load()
		r.check("%s: %d dry-run creates through the OLM upgrade, %d failed, %d not injected%s", l.ns, l.attempted.Load(), l.failed.Load(), l.uninjected.Load(), firstErrors(l))
	}
	if skipped > 0 {
		r.check("%d ticks of the %d/s load skipped with %d creates in flight (the machine held less)", skipped, rotationLoad, rotationInflight)
	}
	if failed > 0 {
		for _, c := range e.Cluster.Egress.Cut() {
			r.check("egress relay cut by its target: %s", c)
		}
		return fmt.Errorf("%d admissions failed or were not injected during the OLM upgrade", failed)
	}
	if len(u.overlaps) > 0 {
		return fmt.Errorf("server Deployments rolled at once: %s", strings.Join(u.overlaps, "; "))
	}
	r.check("the %d server Deployments rolled to %s one at a time, in the order %s (a watch: every stored version seen)", len(u.rolled), u.image, strings.Join(u.rolled, ", "))

	si := &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: secondInjectorName}}
	if err := c.Delete(ctx, si); client.IgnoreNotFound(err) != nil {
		return err
	}
	base := desired.SidecarCR(si).Base()
	if err := cluster.WaitFor(ctx, 2*time.Minute, "SidecarInjector "+secondInjectorName+" and its server gone", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(si), &v1alpha1.SidecarInjector{}); !apierrors.IsNotFound(err) {
			return false, client.IgnoreNotFound(err)
		}
		// The sample's spec, copied, names no server namespace.
		err := c.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: base}, &appsv1.Deployment{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secondNamespace}}
	if err := c.Delete(ctx, ns); client.IgnoreNotFound(err) != nil {
		return err
	}
	// Gone before the README's last line lists what the install left.
	return cluster.WaitFor(ctx, 2*time.Minute, "namespace "+secondNamespace+" deleted", func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(ns), ns)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}
