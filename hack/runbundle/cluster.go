package main

import (
	"context"
	"fmt"
	"time"

	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hookwrightv1alpha1 "github.com/hookwright/hookwright/api/v1alpha1"
)

// crdNames are hookwright's CRDs.
var crdNames = []string{"sidecarinjectors.admission.hookwright.io", "nodeoversells.admission.hookwright.io"}

// operatorDeployment is the operator Deployment's name, from config/default
// and from the CSV.
const operatorDeployment = "hookwright-controller-manager"

// kube is the cluster the targets act on.
type kube struct {
	host string
	c    client.Client
}

// connect reads the kubeconfig and checks the cluster answers and serves
// OLM's API; each failure is an error saying what to do.
func connect(ctx context.Context, s Settings) (*kube, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if s.Kubeconfig != "" {
		rules.ExplicitPath = s.Kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no cluster: %v; start the demo (make demo) or point KUBECONFIG at your cluster", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 15 * time.Second
	cfg.WarningHandler = rest.NoWarnings{}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := dc.ServerVersion(); err != nil {
		return nil, clusterError(cfg.Host, s.Kubeconfig, err)
	}
	if _, err := dc.ServerResourcesForGroupVersion(operatorsv1alpha1.SchemeGroupVersion.String()); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, noOLM(cfg.Host)
		}
		return nil, clusterError(cfg.Host, s.Kubeconfig, err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, operatorsv1alpha1.AddToScheme,
		operatorsv1.AddToScheme, hookwrightv1alpha1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	cfg.Timeout = 0
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &kube{host: cfg.Host, c: c}, nil
}

// install reads what the cluster holds of hookwright.
func (k *kube) install(ctx context.Context, ns string) (Install, error) {
	var in Install
	var subs operatorsv1alpha1.SubscriptionList
	if err := k.c.List(ctx, &subs); err != nil {
		return in, fmt.Errorf("list Subscriptions: %w", err)
	}
	for _, s := range subs.Items {
		if s.Spec == nil || s.Spec.Package != Package {
			continue
		}
		in.Subscriptions = append(in.Subscriptions, Subscription{
			Namespace: s.Namespace, Name: s.Name,
			CatalogNamespace: s.Spec.CatalogSourceNamespace, CatalogName: s.Spec.CatalogSource,
			InstalledCSV: s.Status.InstalledCSV, CurrentCSV: s.Status.CurrentCSV, State: string(s.Status.State),
		})
	}
	for _, n := range crdNames {
		err := k.c.Get(ctx, client.ObjectKey{Name: n}, &apiextensionsv1.CustomResourceDefinition{})
		switch {
		case err == nil:
			in.CRDs = append(in.CRDs, n)
		case !apierrors.IsNotFound(err):
			return in, err
		}
	}
	if len(in.CRDs) == len(crdNames) {
		var sis hookwrightv1alpha1.SidecarInjectorList
		var nos hookwrightv1alpha1.NodeOversellList
		if err := k.c.List(ctx, &sis); err != nil {
			return in, err
		}
		if err := k.c.List(ctx, &nos); err != nil {
			return in, err
		}
		in.CRs = len(sis.Items) + len(nos.Items)
	}
	var deps appsv1.DeploymentList
	if err := k.c.List(ctx, &deps, client.MatchingFields{"metadata.name": operatorDeployment}); err != nil {
		return in, fmt.Errorf("list Deployments: %w", err)
	}
	for _, d := range deps.Items {
		if _, ok := d.Labels["olm.owner"]; !ok {
			in.Deployments = append(in.Deployments, d.Namespace+"/"+d.Name)
		}
	}
	err := k.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: catalogName}, &operatorsv1alpha1.CatalogSource{})
	switch {
	case err == nil:
		in.LeftCatalog = true
	case !apierrors.IsNotFound(err):
		return in, err
	}
	return in, nil
}

// namespaceExists reports whether ns exists.
func (k *kube) namespaceExists(ctx context.Context, ns string) (bool, error) {
	err := k.c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// csv returns the phase of CSV name in ns ("" when it does not exist).
func (k *kube) csvPhase(ctx context.Context, ns, name string) (string, error) {
	csv := &operatorsv1alpha1.ClusterServiceVersion{}
	err := k.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, csv)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return string(csv.Status.Phase), nil
}

// operatorPods lists the CSV's operator pods in ns as "name (phase, node)".
func (k *kube) operatorPods(ctx context.Context, ns string) ([]string, error) {
	var pods corev1.PodList
	if err := k.c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/component": "manager"}); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, fmt.Sprintf("%s (%s on %s)", p.Name, p.Status.Phase, p.Spec.NodeName))
		}
	}
	return out, nil
}

// olmOperatorName is OLM's Operator object for the package in ns
// (operators.coreos.com/v1 Operator <package>.<namespace>).
func olmOperatorName(ns string) string { return Package + "." + ns }

// olmOperatorRefs returns the objects OLM's Operator object for ns still
// lists as its components (Kind/name), and whether it exists.
func (k *kube) olmOperatorRefs(ctx context.Context, ns string) ([]string, bool, error) {
	op := &operatorsv1.Operator{}
	err := k.c.Get(ctx, client.ObjectKey{Name: olmOperatorName(ns)}, op)
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var refs []string
	if op.Status.Components != nil {
		for _, r := range op.Status.Components.Refs {
			refs = append(refs, r.Kind+"/"+r.Name)
		}
	}
	return refs, true, nil
}

// leftOperatorGroups waits (up to a minute) until no Subscription is left
// in ns and returns the OperatorGroups still there: operator-sdk cleanup
// deletes them only when the namespace has no Subscription left, but it
// looks right after deleting the Subscription, which may not be gone yet
// (internal/olm/operator/uninstall.go), so they can stay. None is
// returned while another Subscription lives in ns.
func (k *kube) leftOperatorGroups(ctx context.Context, ns string) ([]string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		var subs operatorsv1alpha1.SubscriptionList
		if err := k.c.List(ctx, &subs, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		if len(subs.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	var ogs operatorsv1.OperatorGroupList
	if err := k.c.List(ctx, &ogs, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []string
	for _, og := range ogs.Items {
		if og.DeletionTimestamp == nil {
			out = append(out, og.Name)
		}
	}
	return out, nil
}
