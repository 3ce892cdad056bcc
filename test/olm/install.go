package olm

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/test/cluster"
)

// InstallOptions configures InstallBundle.
type InstallOptions struct {
	// Namespace is where the OperatorGroup, Subscription and the operator's
	// Deployment go (created if missing). Default "operators".
	Namespace string
	// Timeout bounds each wait (catalog READY, CSV Succeeded). Default 10
	// minutes: OLM resolves and installs in seconds, but this machine may
	// be loaded.
	Timeout time.Duration
}

// Installation is a package installed through a Subscription.
type Installation struct {
	// Namespace holds the OperatorGroup (AllNamespaces: no
	// targetNamespaces), the Subscription and the installed CSV.
	Namespace string
	// Package and Channel are what the Subscription follows.
	Package, Channel string
	// CatalogSource and Subscription are the names of those objects
	// (CatalogSource in OLM's namespace).
	CatalogSource, Subscription string
	// Bundles is the channel, oldest first; the last is the installed one.
	Bundles []*Bundle
	// InstallPlans are the names of the InstallPlans that completed, in
	// order.
	InstallPlans []string

	o       *OLM
	server  *CatalogServer
	timeout time.Duration
}

// CSV returns the name of the installed ClusterServiceVersion.
func (in *Installation) CSV() string { return in.Bundles[len(in.Bundles)-1].Name }

// InstallBundle installs the bundle in directory bundleDir through OLM: it
// renders it into a one-bundle file-based catalog, serves that with opm,
// creates a grpc CatalogSource (named after the package) in OLM's namespace,
// an AllNamespaces OperatorGroup and an Automatic Subscription in
// opts.Namespace, and waits until the InstallPlan is Complete and the CSV is
// Succeeded.
func (o *OLM) InstallBundle(ctx context.Context, bundleDir string, opts InstallOptions) (*Installation, error) {
	if opts.Namespace == "" {
		opts.Namespace = "operators"
	}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Minute
	}
	b, err := RenderBundle(ctx, o.opm(), bundleDir)
	if err != nil {
		return nil, err
	}
	in := &Installation{
		Namespace: opts.Namespace, Package: b.Package, Channel: b.DefaultChannel,
		CatalogSource: b.Package, Subscription: b.Package,
		o: o, timeout: opts.Timeout,
	}
	if err := in.publish(ctx, b); err != nil {
		return nil, err
	}
	if err := o.ensureNamespace(ctx, in.Namespace); err != nil {
		return nil, err
	}
	og := &operatorsv1.OperatorGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: in.Package},
		// No targetNamespaces and no selector: AllNamespaces.
	}
	if err := o.Client.Create(ctx, og); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("operatorgroup: %w", err)
	}
	sub := &operatorsv1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: in.Subscription},
		Spec: &operatorsv1alpha1.SubscriptionSpec{
			CatalogSource:          in.CatalogSource,
			CatalogSourceNamespace: o.Namespace,
			Package:                in.Package,
			Channel:                in.Channel,
			StartingCSV:            b.Name,
			InstallPlanApproval:    operatorsv1alpha1.ApprovalAutomatic,
		},
	}
	if err := o.Client.Create(ctx, sub); err != nil {
		return nil, fmt.Errorf("subscription: %w", err)
	}
	if err := in.waitInstalled(ctx, b.Name); err != nil {
		return nil, err
	}
	return in, nil
}

// Upgrade publishes the bundle in bundleDir as the channel's new head,
// replacing the installed CSV, and waits until OLM has installed it: the
// Subscription's installedCSV is the new CSV, its InstallPlan is Complete,
// the CSV is Succeeded and the replaced CSV is gone.
func (in *Installation) Upgrade(ctx context.Context, bundleDir string) error {
	b, err := RenderBundle(ctx, in.o.opm(), bundleDir)
	if err != nil {
		return err
	}
	if b.Package != in.Package {
		return fmt.Errorf("upgrade: bundle %s is of package %q, installed %q", b.Name, b.Package, in.Package)
	}
	old := in.CSV()
	if err := in.publish(ctx, b); err != nil {
		return err
	}
	if err := in.waitInstalled(ctx, b.Name); err != nil {
		return err
	}
	return in.o.wait(ctx, in.timeout, fmt.Sprintf("replaced csv %s/%s deleted", in.Namespace, old), func(ctx context.Context) (bool, error) {
		err := in.o.Client.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: old}, &operatorsv1alpha1.ClusterServiceVersion{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// StopCatalog stops the opm process serving the catalog, once the
// install is removed (operator-sdk cleanup deletes the CatalogSource, not
// the server behind it).
func (in *Installation) StopCatalog() {
	if in.server != nil {
		in.server.Stop()
		in.server = nil
	}
}

// publish appends b to the channel, serves the new catalog from a new opm
// process and points the CatalogSource at it (then stops the old server).
func (in *Installation) publish(ctx context.Context, b *Bundle) error {
	bundles := append(append([]*Bundle{}, in.Bundles...), b)
	objs, err := BuildCatalog(in.Channel, bundles...)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("catalog-%s-%d", in.Package, len(bundles))
	dir := filepath.Join(in.o.Dir, name)
	if err := WriteCatalog(ctx, in.o.opm(), dir, objs); err != nil {
		return err
	}
	srv, err := in.o.ServeCatalog(ctx, "opm-"+name, dir)
	if err != nil {
		return err
	}
	if err := in.o.ApplyCatalogSource(ctx, in.CatalogSource, srv.Addr, in.timeout); err != nil {
		srv.Stop()
		return fmt.Errorf("%w%s", err, in.o.Logs(3000))
	}
	if in.server != nil {
		in.server.Stop()
	}
	in.server, in.Bundles = srv, bundles
	return nil
}

// waitInstalled waits until the Subscription has installed csv through a
// Complete InstallPlan and the CSV is Succeeded.
func (in *Installation) waitInstalled(ctx context.Context, csv string) error {
	o := in.o
	start := time.Now()
	sub := &operatorsv1alpha1.Subscription{}
	var plan string
	err := o.wait(ctx, in.timeout, fmt.Sprintf("subscription %s/%s installed %s through a Complete InstallPlan", in.Namespace, in.Subscription, csv), func(ctx context.Context) (bool, error) {
		if err := o.Client.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: in.Subscription}, sub); err != nil {
			return false, err
		}
		st := sub.Status
		if st.InstallPlanRef == nil || st.CurrentCSV != csv {
			return false, fmt.Errorf("state %q currentCSV %q installedCSV %q conditions %s", st.State, st.CurrentCSV, st.InstalledCSV, subConditions(sub))
		}
		ip := &operatorsv1alpha1.InstallPlan{}
		if err := o.Client.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: st.InstallPlanRef.Name}, ip); err != nil {
			return false, err
		}
		switch ip.Status.Phase {
		case operatorsv1alpha1.InstallPlanPhaseComplete:
		case operatorsv1alpha1.InstallPlanPhaseFailed:
			return false, cluster.Permanent(fmt.Errorf("installplan %s failed: %s", ip.Name, ipConditions(ip)))
		default:
			return false, fmt.Errorf("installplan %s phase %q %s", ip.Name, ip.Status.Phase, ipConditions(ip))
		}
		if st.InstalledCSV != csv {
			return false, fmt.Errorf("installedCSV %q", st.InstalledCSV)
		}
		plan = ip.Name
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w%s", err, o.Logs(4000))
	}
	o.logf("olm: installplan %s complete for %s after %s", plan, csv, time.Since(start).Round(time.Millisecond))
	c := &operatorsv1alpha1.ClusterServiceVersion{}
	err = o.wait(ctx, in.timeout, fmt.Sprintf("csv %s/%s Succeeded", in.Namespace, csv), func(ctx context.Context) (bool, error) {
		if err := o.Client.Get(ctx, client.ObjectKey{Namespace: in.Namespace, Name: csv}, c); err != nil {
			return false, err
		}
		if c.Status.Phase == operatorsv1alpha1.CSVPhaseFailed {
			// OLM retries some failures (e.g. requirements not met yet);
			// keep waiting but report the reason.
			return false, fmt.Errorf("phase Failed: %s: %s", c.Status.Reason, c.Status.Message)
		}
		if c.Status.Phase != operatorsv1alpha1.CSVPhaseSucceeded {
			return false, fmt.Errorf("phase %q reason %q: %s", c.Status.Phase, c.Status.Reason, c.Status.Message)
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w%s", err, o.Logs(4000))
	}
	in.InstallPlans = append(in.InstallPlans, plan)
	o.logf("olm: csv %s Succeeded %s after the subscription", csv, time.Since(start).Round(time.Millisecond))
	return nil
}

func subConditions(s *operatorsv1alpha1.Subscription) string {
	var parts []string
	for _, c := range s.Status.Conditions {
		if c.Status == "True" {
			parts = append(parts, fmt.Sprintf("%s(%s: %s)", c.Type, c.Reason, c.Message))
		}
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func ipConditions(ip *operatorsv1alpha1.InstallPlan) string {
	var parts []string
	for _, c := range ip.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	for _, s := range ip.Status.Plan {
		if s.Status != operatorsv1alpha1.StepStatusCreated && s.Status != operatorsv1alpha1.StepStatusPresent {
			parts = append(parts, fmt.Sprintf("step %s/%s %s", s.Resource.Kind, s.Resource.Name, s.Status))
		}
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func (o *OLM) opm() string { return filepath.Join(o.Cluster.Bin, "opm") }
