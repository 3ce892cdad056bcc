package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/fleet"
)

// whatIfReport is what `hookwright status --what-if` prints (-o json|yaml).
type whatIfReport struct {
	Name string `json:"name"`
	fleet.WhatIf
}

// runWhatIf plans the SidecarInjector of file against the live pods
// (fleet.PlanWhatIf). It only reads.
func runWhatIf(ctx context.Context, w io.Writer, c client.Client, src *injectorSource, file string, out *outputFlags) error {
	crs, err := src.loadInjectors(ctx, injectorQuery{file: file})
	if err != nil {
		return err
	}
	next := crs[0]
	if next.Name == "" {
		return fmt.Errorf("%s: the SidecarInjector has no metadata.name", file)
	}
	// The cluster's version, if any, is what the pods are judged by today.
	var now *fleet.Injector
	live, err := src.loadInjectors(ctx, injectorQuery{names: []string{next.Name}, missingOK: true})
	if err != nil {
		return err
	}
	if len(live) == 1 {
		inj, err := fleet.NewInjector(live[0], src.settings(), src.kubeVersion)
		if err == nil {
			now = &inj
		}
		// A pinned revision resolves from the cluster's copy, as the
		// operator would keep it.
		if next.Spec.Revision != "" && next.Status.Pinned == nil {
			next.Status.Pinned = live[0].Status.Pinned
		}
	}
	nextInj, err := fleet.NewInjector(next, src.settings(), src.kubeVersion)
	if err != nil {
		return fmt.Errorf("%s: SidecarInjector %s does not compile: %w", file, next.Name, err)
	}
	pods, nsLabels, err := livePods(ctx, c)
	if err != nil {
		return err
	}
	rep := whatIfReport{Name: next.Name, WhatIf: fleet.PlanWhatIf(now, nextInj, podPtrs(pods), nsLabels)}
	return writeWhatIf(w, rep, out)
}

// writeWhatIf prints the plan, or with -o one WhatIfPlan item named
// after the SidecarInjector (kubectl's printers).
func writeWhatIf(w io.Writer, rep whatIfReport, out *outputFlags) error {
	if !out.text() {
		return out.printObject(w, "WhatIfPlan", rep.Name, rep)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	before := rep.Before
	if before == "" {
		before = "none in the cluster"
	}
	fmt.Fprintf(tw, "SidecarInjector %s: revision %s (now %s), nothing written\n", rep.Name, rep.Revision, before)
	fmt.Fprintf(tw, "%d counted pods, %d would not be current (%d of them current or not counted today): %d in place, %d by restart\n",
		rep.Counted, rep.Change, rep.New, rep.InPlace, rep.Restart)
	if len(rep.Transitions) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "NOW -> AFTER\tPODS")
		for _, k := range sortedKeys(rep.Transitions) {
			fmt.Fprintf(tw, "%s\t%d\n", k, rep.Transitions[k])
		}
	}
	if len(rep.Namespaces) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "NAMESPACE\tCHANGE\tNEW\tIN-PLACE\tRESTART")
		for _, n := range rep.Namespaces {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", n.Name, n.Change, n.New, n.InPlace, n.Restart)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p := rep.Example; p != nil {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "example: pod %s/%s, %s: %s\n", p.Namespace, p.Name, p.State, p.Reason)
		fmt.Fprintf(w, "  change: %s: %s\n", p.Way, p.Why)
		for _, l := range fleet.DiffLines(p.Containers) {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	if rep.ErrorCount > 0 {
		fmt.Fprintf(w, "\n%d pods fail to render with the new version (not counted):\n", rep.ErrorCount)
		for _, e := range rep.Errors {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	return nil
}

func podPtrs(pods []corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, len(pods))
	for i := range pods {
		out[i] = &pods[i]
	}
	return out
}

func sortedKeys(m map[string]int) []string {
	return slices.Sorted(maps.Keys(m))
}
