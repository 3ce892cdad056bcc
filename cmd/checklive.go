package main

import (
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/fleet"
)

// checkLive is check-inject --live: the running pod ns/name against every
// SidecarInjector of the cluster (or --injector NAME, or --config FILE),
// each classified and planned by fleet.PlanPod. It only reads.
func checkLive(ctx context.Context, w io.Writer, src *injectorSource, ns, name string) error {
	c, err := src.clusterClient()
	if err != nil {
		return err
	}
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
		return fmt.Errorf("pod %s/%s: %w", ns, name, err)
	}
	nsLabels, err := namespaceLabels(ctx, c, ns)
	if err != nil {
		return err
	}
	crs, err := src.loadInjectors(ctx, src.query())
	if err != nil {
		return err
	}
	broken := 0
	for i, cr := range crs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		inj, err := fleet.NewInjector(cr, src.settings(), src.kubeVersion)
		if err != nil {
			broken++
			fmt.Fprintf(w, "SidecarInjector %s: not checked, it does not compile: %v\n", cr.Name, err)
			continue
		}
		p, err := fleet.PlanPod(inj, pod, nsLabels)
		if err != nil {
			broken++
			fmt.Fprintf(w, "SidecarInjector %s: %v\n", cr.Name, err)
			continue
		}
		writePlan(w, cr.Name, inj.Revision, p)
	}
	if broken > 0 {
		return fmt.Errorf("%d of %d SidecarInjectors not checked", broken, len(crs))
	}
	return nil
}

func writePlan(w io.Writer, injector, revision string, p fleet.Plan) {
	fmt.Fprintf(w, "pod %s/%s, SidecarInjector %s (current revision %s)\n", p.Namespace, p.Name, injector, revision)
	state := string(p.State)
	if !p.Counted {
		state = "not matched"
	}
	if p.Reason != "" {
		state += ": " + p.Reason
	}
	fmt.Fprintf(w, "  state:  %s\n", state)
	fmt.Fprintf(w, "  rule:   %s\n", p.Rule)
	fmt.Fprintf(w, "  change: %s: %s\n", p.Way, p.Why)
	for _, l := range fleet.DiffLines(p.Containers) {
		fmt.Fprintf(w, "    %s\n", l)
	}
}
