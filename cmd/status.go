package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/fleet"
)

func init() {
	subcommands = append(subcommands, newStatusCommand)
}

// statusReport is what `hookwright status` prints (-o json|yaml).
type statusReport struct {
	Injectors []injectorStatus `json:"injectors"`
}

// injectorStatus is one SidecarInjector's fleet as the command classified
// it from the live pods, next to what the operator last wrote.
type injectorStatus struct {
	Name string `json:"name"`
	// Revision is the spec's current revision.
	Revision string                    `json:"revision"`
	Counts   v1alpha1.FleetCounts      `json:"counts"`
	Reported *v1alpha1.FleetStatus     `json:"reported,omitempty"`
	Spaces   []v1alpha1.NamespaceFleet `json:"namespaces"`
	// Pods are every counted pod (--pods).
	Pods []fleet.Pod `json:"pods,omitempty"`
	// Rollout is the operator's last status.rollout (spec.rollout).
	Rollout *v1alpha1.RolloutStatus `json:"rollout,omitempty"`
	// RolloutCondition is the RolloutBlocked condition's reason and
	// message.
	RolloutCondition string `json:"rolloutCondition,omitempty"`
	// Error is set when the SidecarInjector does not compile.
	Error string `json:"error,omitempty"`
}

func newStatusCommand() *cobra.Command { return statusCommand(&injectorSource{}) }

func statusCommand(src *injectorSource) *cobra.Command {
	var (
		pods, whatIf bool
		file         string
		out          outputFlags
	)
	cmd := &cobra.Command{
		Use:   "status [INJECTOR...]",
		Short: "Which running pods carry which revision of each SidecarInjector's sidecars, and which should and do not",
		Long: `Read the SidecarInjectors (all, or those named), every pod and namespace with
the kubeconfig kubectl uses (--kubeconfig, KUBECONFIG, ~/.kube/config or
in-cluster), classify each pod with the injector's own decision (the
function the webhook runs) as the operator does for status.fleet, and print
per injector its revision and counts (matched, injected, current, outdated,
missing, orphaned), the operator's last reported counts, and a table per
namespace; --pods adds one line per counted pod with its state and why
(outdated: the revision it has and the injected containers; missing: the
rule that matched and when the pod was created; orphaned: the rule that no
longer matches). -o json|yaml|name|jsonpath=... prints the same as a List
of SidecarInjectorFleet items (kubectl's printers). It needs list of
sidecarinjectors, pods and namespaces; it changes nothing.

--what-if -f CR.yaml plans the SidecarInjector of the file as if applied,
without writing anything: how many running pods it would leave Outdated,
Missing or Orphaned (and how many of them are current today), per
namespace, how many could be brought up to date in place (only images
and/or resources of injected containers differ) and how many need a new
pod, the state transitions against the version in the cluster, and the
container diff of one example pod (as check-inject --live shows it).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			if whatIf != (file != "") {
				return fmt.Errorf("--what-if and -f CR.yaml go together")
			}
			if whatIf && len(args) > 0 {
				return fmt.Errorf("--what-if takes no injector names: the file names it")
			}
			if !whatIf && src.kubeVersion == "" {
				// Classifying does not read the version; skip asking for it.
				src.kubeVersion = offlineKubeVersion
			}
			c, err := src.clusterClient()
			if err != nil {
				return err
			}
			if src.kubeVersion == "" {
				src.kubeVersion = offlineKubeVersion
			}
			ctx := cmd.Context()
			if whatIf {
				return runWhatIf(ctx, cmd.OutOrStdout(), c, src, file, &out)
			}
			crs, err := src.loadInjectors(ctx, injectorQuery{names: args, noneOK: true})
			if err != nil {
				return err
			}
			podList, nsLabels, err := livePods(ctx, c)
			if err != nil {
				return err
			}
			rep := buildStatus(crs, podList, nsLabels, src.settings(), pods)
			return writeStatus(cmd.OutOrStdout(), rep, &out, time.Now())
		},
	}
	fs := cmd.Flags()
	fs.BoolVar(&pods, "pods", false, "one line per counted pod with its state and why")
	fs.BoolVar(&whatIf, "what-if", false, "plan the SidecarInjector of -f as if applied; writes nothing")
	fs.StringVarP(&file, "filename", "f", "", "SidecarInjector YAML/JSON for --what-if, - for stdin")
	src.addNamespaceFlags(fs)
	src.cluster.addFlags(fs, "", "")
	out.addFlags(cmd)
	return cmd
}

// buildStatus classifies pods for every cr as the operator does.
func buildStatus(crs []*v1alpha1.SidecarInjector, pods []corev1.Pod, nsLabels map[string]map[string]string, settings desired.Settings, withPods bool) statusReport {
	rep := statusReport{Injectors: []injectorStatus{}}
	for i := range crs {
		cr := crs[i]
		st := injectorStatus{Name: cr.Name, Reported: cr.Status.Fleet, Spaces: []v1alpha1.NamespaceFleet{}, Rollout: cr.Status.Rollout}
		if c := apimeta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionRolloutBlocked); c != nil {
			st.RolloutCondition = c.Reason + ": " + c.Message
		}
		inj, err := fleet.NewInjector(cr, settings, "")
		if err != nil {
			st.Error = err.Error()
			rep.Injectors = append(rep.Injectors, st)
			continue
		}
		st.Revision = inj.Revision
		var classified []fleet.Pod
		for j := range pods {
			if p, ok := fleet.Classify(inj, &pods[j], nsLabels[pods[j].Namespace]); ok {
				classified = append(classified, p)
			}
		}
		sum := fleet.Summarize(classified)
		st.Counts = sum.Status.FleetCounts
		if sum.Namespaces != nil {
			st.Spaces = sum.Namespaces
		}
		if withPods {
			st.Pods = sortedPods(classified)
			for k := range st.Pods {
				if st.Pods[k].State == fleet.Missing {
					if note := fleet.OutageNote(st.Pods[k].Created, cr.Status.Conditions); note != "" {
						st.Pods[k].Reason += "; " + note
					}
				}
			}
		}
		rep.Injectors = append(rep.Injectors, st)
	}
	return rep
}

// livePods lists every pod and every namespace's labels (an empty map for
// a namespace without labels).
func livePods(ctx context.Context, c client.Client) ([]corev1.Pod, map[string]map[string]string, error) {
	var podList corev1.PodList
	if err := c.List(ctx, &podList); err != nil {
		return nil, nil, fmt.Errorf("list pods: %w", err)
	}
	var nsList corev1.NamespaceList
	if err := c.List(ctx, &nsList); err != nil {
		return nil, nil, fmt.Errorf("list namespaces: %w", err)
	}
	nsLabels := map[string]map[string]string{}
	for i := range nsList.Items {
		nsLabels[nsList.Items[i].Name] = labelsOf(&nsList.Items[i])
	}
	return podList.Items, nsLabels, nil
}

// namespaceLabels reads one namespace's labels (labelsOf). The error is
// the client's, prefixed "namespace NAME".
func namespaceLabels(ctx context.Context, c client.Client, name string) (map[string]string, error) {
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", name, err)
	}
	return labelsOf(ns), nil
}

// labelsOf is ns's labels, an empty map when it has none: the engine
// tells an empty map (a namespace without labels) from nil (not read).
func labelsOf(ns *corev1.Namespace) map[string]string {
	if ns.Labels == nil {
		return map[string]string{}
	}
	return ns.Labels
}

// sortedPods orders pods by namespace and name.
func sortedPods(pods []fleet.Pod) []fleet.Pod {
	out := slices.Clone(pods)
	slices.SortFunc(out, func(a, b fleet.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// writeStatus prints tables, or with -o one SidecarInjectorFleet item per
// injector (kubectl's printers: json, yaml, name, jsonpath, go-template).
func writeStatus(w io.Writer, rep statusReport, out *outputFlags, now time.Time) error {
	if !out.text() {
		return out.printList(w, "SidecarInjectorFleet", len(rep.Injectors),
			func(i int) any { return rep.Injectors[i] }, func(i int) string { return rep.Injectors[i].Name })
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(rep.Injectors) == 0 {
		fmt.Fprintln(tw, "no SidecarInjectors")
	}
	for i, st := range rep.Injectors {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		if st.Error != "" {
			fmt.Fprintf(tw, "SidecarInjector %s: does not compile: %s\n", st.Name, st.Error)
			continue
		}
		fmt.Fprintf(tw, "SidecarInjector %s, revision %s\n", st.Name, st.Revision)
		fmt.Fprintln(tw, "\tMATCHED\tINJECTED\tCURRENT\tOUTDATED\tMISSING\tORPHANED")
		row := func(label string, c v1alpha1.FleetCounts) {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", label, c.MatchedPods, c.InjectedPods, c.CurrentPods, c.OutdatedPods, c.MissingPods, c.OrphanedPods)
		}
		row("live", st.Counts)
		if st.Reported != nil {
			row("reported", st.Reported.FleetCounts)
		}
		if ro := st.Rollout; ro != nil {
			fmt.Fprintf(tw, "rollout %s to %s: %d/%d updated, %d unavailable", ro.Strategy, ro.Revision, ro.Updated, ro.Total, ro.Unavailable)
			if ro.Partitioned > 0 {
				fmt.Fprintf(tw, ", %d partitioned", ro.Partitioned)
			}
			fmt.Fprintln(tw)
			if st.RolloutCondition != "" {
				fmt.Fprintf(tw, "  %s\n", st.RolloutCondition)
			}
			for _, sk := range ro.Skipped {
				fmt.Fprintf(tw, "  skipped %d: %s (%s)\n", sk.Count, sk.Reason, strings.Join(sk.Pods, ", "))
			}
		}
		if len(st.Spaces) > 0 {
			fmt.Fprintln(tw)
			fmt.Fprintln(tw, "NAMESPACE\tMATCHED\tINJECTED\tCURRENT\tOUTDATED\tMISSING\tORPHANED")
			for _, ns := range st.Spaces {
				row(ns.Name, ns.FleetCounts)
			}
		}
		if len(st.Pods) > 0 {
			fmt.Fprintln(tw)
			fmt.Fprintln(tw, "NAMESPACE\tPOD\tSTATE\tREVISION\tAGE\tWHY")
			for _, p := range st.Pods {
				rev := p.Revision
				if rev == "" {
					rev = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, p.State, rev, age(now, p.Created), p.Reason)
			}
		}
	}
	return tw.Flush()
}

// age is kubectl's coarse age of a creation time.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
