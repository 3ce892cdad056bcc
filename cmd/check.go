package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/cmd/app"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/healthcheck"
	"github.com/hookwright/hookwright/internal/version"
)

func init() {
	subcommands = append(subcommands, newCheckCommand)
}

// checkTimeout bounds each request of check when --request-timeout is
// not given: an address that drops packets must not hang the command.
const checkTimeout = 10 * time.Second

// errChecksFailed makes the exit code non-zero once the results are printed.
var errChecksFailed = errors.New("checks failed")

func newCheckCommand() *cobra.Command {
	var (
		cluster clusterFlags
		out     outputFlags
		pre     bool
	)
	cmd := &cobra.Command{
		Use:   "check [--pre]",
		Short: "Go/no-go: is the installation healthy (or, with --pre, can this cluster take it), one line per check",
		Long: `Read the installation with the kubeconfig kubectl uses and print one line
per check, grouped by area: √ passed, ‼ warning (with a hint; does not fail
the run), × failed (with a hint). The exit code is 1 when a check failed.

Checks: the CRDs installed at ` + v1alpha1.GroupVersion.Version + `; the operator's Deployment
(in -n, default hookwright-system) and leader Lease; per SidecarInjector and
NodeOversell its Ready and WebhookReachable conditions, its serving
certificate and the caBundle's CA (warning under 30 days), its webhook
configuration calling a Service with ready endpoints and trusting the CA
that signed the serving certificate; failurePolicy Fail over every
namespace; the sum of our webhooks' timeouts on nodes/status against the
kubelet's 10 s; pods missing their sidecars or outdated (status.fleet); the
operator's and servers' image versions.

--pre, before installing: the API server's version and the APIs each
feature needs, the installer's rights (SelfSubjectAccessReview), and other
mutating webhooks that see pod creates or node status writes.

It only reads (and creates SelfSubjectAccessReviews). -o json|yaml|name|
jsonpath=... prints the results as a List of CheckResult items; see
docs/cli.md for every check, its id and its hint.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			cfg, err := cluster.restConfig()
			if err != nil {
				return err
			}
			if cfg.Timeout == 0 {
				cfg.Timeout = checkTimeout
			}
			facts := gatherCheckFacts(cmd.Context(), cfg, cluster.namespace(), pre)
			var rs []healthcheck.Result
			if pre {
				rs = healthcheck.Pre(facts)
			} else {
				rs = healthcheck.Run(facts)
			}
			if out.text() {
				writeCheckText(cmd.OutOrStdout(), rs)
			} else if err := out.printList(cmd.OutOrStdout(), "CheckResult", len(rs),
				func(i int) any { return rs[i] }, checkNames(rs)); err != nil {
				return err
			}
			if healthcheck.Summarize(rs).Failures > 0 {
				return errChecksFailed
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&pre, "pre", false, "check the cluster before an install instead of the installation")
	cluster.addFlags(cmd.Flags(), envOr("POD_NAMESPACE", "hookwright-system"), "namespace of the operator")
	out.addFlags(cmd)
	return cmd
}

// checkNames are unique names for -o name: "<id>" or "<id>.<subject>"
// with the area's CR name, and a counter for repeats.
func checkNames(rs []healthcheck.Result) func(int) string {
	names := make([]string, len(rs))
	seen := map[string]int{}
	for i, r := range rs {
		n := r.ID
		if kind, name, ok := strings.Cut(r.Area, " "); ok {
			n += "." + strings.ToLower(kind) + "." + name
		}
		seen[n]++
		if seen[n] > 1 {
			n = fmt.Sprintf("%s.%d", n, seen[n])
		}
		names[i] = n
	}
	return func(i int) string { return names[i] }
}

// writeCheckText prints the results grouped by area in order of first
// appearance, as linkerd check does, and a last line of counts.
func writeCheckText(w io.Writer, rs []healthcheck.Result) {
	var areas []string
	by := map[string][]healthcheck.Result{}
	for _, r := range rs {
		if _, ok := by[r.Area]; !ok {
			areas = append(areas, r.Area)
		}
		by[r.Area] = append(by[r.Area], r)
	}
	mark := map[healthcheck.Status]string{healthcheck.OK: "√", healthcheck.Warn: "‼", healthcheck.Fail: "×", healthcheck.Skip: "-"}
	for i, a := range areas {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\n%s\n", a, strings.Repeat("-", len(a)))
		for _, r := range by[a] {
			line := mark[r.Status] + " " + r.Description
			if r.Message != "" {
				line += ": " + r.Message
			}
			fmt.Fprintln(w, line)
			if r.Hint != "" {
				fmt.Fprintf(w, "    hint: %s (docs/cli.md#check-%s)\n", r.Hint, r.ID)
			}
		}
	}
	s := healthcheck.Summarize(rs)
	verdict := "√"
	if s.Failures > 0 {
		verdict = "×"
	}
	fmt.Fprintf(w, "\nStatus check results are %s: %d passed, %d warnings, %d failed", verdict, s.OK, s.Warnings, s.Failures)
	if s.Skipped > 0 {
		fmt.Fprintf(w, ", %d skipped", s.Skipped)
	}
	fmt.Fprintln(w)
}

// gatherCheckFacts reads everything the checks judge. It never fails:
// each read's error goes into its fact.
func gatherCheckFacts(ctx context.Context, cfg *rest.Config, ns string, pre bool) healthcheck.Facts {
	f := healthcheck.Facts{Now: time.Now(), CLIVersion: version.Version, OperatorNamespace: ns}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		f.ServerVersion.Err = err
		return f
	}
	v, err := dc.ServerVersion()
	if err != nil {
		f.ServerVersion.Err = err
		return f
	}
	f.ServerVersion.Value = v.GitVersion
	c, err := clientFor(cfg)
	if err != nil {
		f.ServerVersion.Err = err
		return f
	}
	var whs admissionregistrationv1.MutatingWebhookConfigurationList
	f.MutatingWebhooks.Err = c.List(ctx, &whs)
	f.MutatingWebhooks.Value = whs.Items
	if pre {
		f.Pre.Resources = discoveryResources(dc)
		f.Pre.Access = accessReviews(ctx, c, ns)
		return f
	}

	f.CRDs = map[string]healthcheck.Got[*apiextensionsv1.CustomResourceDefinition]{}
	for _, name := range healthcheck.CRDNames {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, crd)
		f.CRDs[name] = healthcheck.Got[*apiextensionsv1.CustomResourceDefinition]{Value: crd, Err: err}
	}
	f.Operator = operatorDeployment(ctx, c, ns)
	lease := &coordinationv1.Lease{}
	err = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: app.LeaderElectionID}, lease)
	f.Lease = healthcheck.Got[*coordinationv1.Lease]{Value: lease, Err: err}

	settings := desired.Settings{Namespace: ns}
	crs, err := listCRs(ctx, c)
	f.CRs.Err = err
	f.EndpointSlices = map[string]healthcheck.Got[[]discoveryv1.EndpointSlice]{}
	for _, op := range crs {
		cr := healthcheck.CR{Kind: op.Kind.Name, Name: op.Object.GetName(), Generation: op.Object.GetGeneration(),
			WebhookConfiguration: op.Base()}
		switch o := op.Object.(type) {
		case *v1alpha1.SidecarInjector:
			cr.ObservedGeneration, cr.Conditions, cr.Fleet = o.Status.ObservedGeneration, o.Status.Conditions, o.Status.Fleet
		case *v1alpha1.NodeOversell:
			cr.ObservedGeneration, cr.Conditions = o.Status.ObservedGeneration, o.Status.Conditions
		}
		serverNS := desired.ServerNamespace(op, settings)
		cr.ServingSecretNamespace = serverNS
		sec := &corev1.Secret{}
		err := c.Get(ctx, client.ObjectKey{Namespace: serverNS, Name: desired.ServingSecretName(op)}, sec)
		cr.ServingSecret = healthcheck.Got[*corev1.Secret]{Value: sec, Err: err}
		d := &appsv1.Deployment{}
		err = c.Get(ctx, client.ObjectKey{Namespace: serverNS, Name: op.Base()}, d)
		cr.Server = healthcheck.Got[*appsv1.Deployment]{Value: d, Err: err}
		f.CRs.Value = append(f.CRs.Value, cr)
	}
	// The endpoints of every Service our webhook configurations call.
	for _, w := range whs.Items {
		if w.Labels[desired.LabelManagedBy] != desired.ManagedByValue {
			continue
		}
		for _, wh := range w.Webhooks {
			svc := wh.ClientConfig.Service
			if svc == nil {
				continue
			}
			key := svc.Namespace + "/" + svc.Name
			if _, done := f.EndpointSlices[key]; done {
				continue
			}
			var es discoveryv1.EndpointSliceList
			err := c.List(ctx, &es, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name})
			f.EndpointSlices[key] = healthcheck.Got[[]discoveryv1.EndpointSlice]{Value: es.Items, Err: err}
		}
	}
	return f
}

// operatorDeployment is the Deployment labelled as config/manager labels
// the operator's (kustomize and the OLM bundle alike).
func operatorDeployment(ctx context.Context, c client.Client, ns string) healthcheck.Got[*appsv1.Deployment] {
	var list appsv1.DeploymentList
	err := c.List(ctx, &list, client.InNamespace(ns),
		client.MatchingLabels{"app.kubernetes.io/name": "hookwright", "app.kubernetes.io/component": "manager"})
	switch {
	case err != nil:
		return healthcheck.Got[*appsv1.Deployment]{Err: err}
	case len(list.Items) == 0:
		return healthcheck.Got[*appsv1.Deployment]{Err: apierrors.NewNotFound(schema.GroupResource{Group: "apps", Resource: "deployments"}, "hookwright-controller-manager")}
	}
	return healthcheck.Got[*appsv1.Deployment]{Value: &list.Items[0]}
}

// listCRs lists every SidecarInjector and NodeOversell. A kind the API
// server does not serve (CRD missing) is a NotFound error.
func listCRs(ctx context.Context, c client.Client) ([]desired.CR, error) {
	var sis v1alpha1.SidecarInjectorList
	var nos v1alpha1.NodeOversellList
	var out []desired.CR
	for _, l := range []client.ObjectList{&sis, &nos} {
		if err := c.List(ctx, l); err != nil {
			if apimeta.IsNoMatchError(err) {
				return nil, apierrors.NewNotFound(schema.GroupResource{Group: v1alpha1.GroupVersion.Group}, err.Error())
			}
			return nil, err
		}
	}
	for i := range sis.Items {
		out = append(out, desired.SidecarCR(&sis.Items[i]))
	}
	for i := range nos.Items {
		out = append(out, desired.OversellCR(&nos.Items[i]))
	}
	return out, nil
}

// discoveryResources maps each served group version to its resources.
// Partial discovery (an aggregated API down) still returns what it got.
func discoveryResources(dc discovery.DiscoveryInterface) healthcheck.Got[map[string][]string] {
	_, lists, err := dc.ServerGroupsAndResources()
	out := map[string][]string{}
	for _, l := range lists {
		for _, r := range l.APIResources {
			out[l.GroupVersion] = append(out[l.GroupVersion], r.Name)
		}
	}
	if err != nil && len(out) > 0 && discovery.IsGroupDiscoveryFailedError(err) {
		err = nil
	}
	return healthcheck.Got[map[string][]string]{Value: out, Err: err}
}

// accessReviews asks the API server what the current user may do, for
// every right healthcheck.InstallerAccess lists (namespace "-" is ns).
func accessReviews(ctx context.Context, c client.Client, ns string) []healthcheck.Access {
	var out []healthcheck.Access
	for _, a := range healthcheck.InstallerAccess {
		if a.Namespace == "-" {
			a.Namespace = ns
		}
		r := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: a.Verb, Group: a.Group, Resource: a.Resource, Namespace: a.Namespace}}}
		if err := c.Create(ctx, r); err != nil {
			a.Err = err
		} else {
			a.Allowed, a.Reason = r.Status.Allowed, r.Status.Reason
		}
		out = append(out, a)
	}
	return out
}
