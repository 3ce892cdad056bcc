package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func init() {
	subcommands = append(subcommands, newCheckInjectCommand)
}

func newCheckInjectCommand() *cobra.Command { return checkInjectCommand(&injectorSource{}) }

// checkInjectCommand reads SidecarInjectors through src (tests preset its client).
func checkInjectCommand(src *injectorSource) *cobra.Command {
	var file, live string
	cmd := &cobra.Command{
		Use:   "check-inject (-f POD.yaml | -n NS POD | -n NS --live POD) [--injector NAME | --config CR.yaml]",
		Short: "Tell whether pods would be injected, and by which rule",
		Long: `For a pod in the cluster (-n NS POD) or every pod and pod template in a
manifest (-f FILE), print whether each SidecarInjector would inject it and
the exact deciding rule: system or operator namespace, spared (critical
priority class, mirror pod, --excluded-namespaces), namespaceSelector,
objectSelector, hostNetwork, the inject label or annotation (and ignored
values), never/alwaysInjectSelector, policy. It also points out inject keys
placed on a workload's own metadata instead of its pod template. Without
--injector or --config every SidecarInjector in the cluster is checked; one
that does not compile gets an error line, the others are still checked, and
the command then exits non-zero (the check is incomplete).

--live POD reads the running pod (-n NS) and tells, per SidecarInjector,
its state (Current, Outdated, Missing, Orphaned or not matched, as
hookwright status counts it), the deciding rule, and what the current
revision would change: the injected containers and init containers that
differ (image, resources, env, command, args, restartPolicy), from the
engine's own injection of the pod with its injected containers removed,
and whether that can be done in place (only images and/or resources of
injected containers differ) or needs a new pod (Restart). It only reads.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns := src.cluster.namespace()
			if live != "" {
				if file != "" || len(args) > 0 {
					return fmt.Errorf("--live POD takes no -f and no other pod name")
				}
				return checkLive(cmd.Context(), cmd.OutOrStdout(), src, ns, live)
			}
			if (file == "") == (len(args) == 0) {
				return fmt.Errorf("give either -f FILE or a pod name (with -n NAMESPACE)")
			}
			ctx := cmd.Context()
			cfgs, broken, params, err := src.load(ctx)
			if err != nil {
				return err
			}
			// A broken injector must not hide the verdicts of the others.
			for _, b := range broken {
				fmt.Fprintf(cmd.OutOrStdout(), "%v (not checked: it does not compile; its servers keep their last good version)\n", b)
			}
			var sites []sidecar.PodSite
			if file != "" {
				b, err := readInput(file)
				if err != nil {
					return err
				}
				objs, err := sidecar.ReadObjects(bytes.NewReader(b))
				if err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
				for _, o := range objs {
					sites = append(sites, sidecar.FindPods(o, ns)...)
				}
			} else {
				c, err := src.clusterClient()
				if err != nil {
					return err
				}
				pod := &corev1.Pod{}
				if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: args[0]}, pod); err != nil {
					return err
				}
				pod.APIVersion, pod.Kind = "v1", "Pod"
				b, err := json.Marshal(pod)
				if err != nil {
					return err
				}
				var obj map[string]any
				if err := json.Unmarshal(b, &obj); err != nil {
					return err
				}
				sites = sidecar.FindPods(obj, ns)
			}
			labels := map[string]map[string]string{}
			nsLabels := func(name string) map[string]string {
				if src.configFile != "" && len(args) == 0 {
					return nil // offline
				}
				if l, ok := labels[name]; ok {
					return l
				}
				c, err := src.clusterClient()
				if err != nil {
					return nil
				}
				// Unreadable: nil, and namespaceSelector is not checked.
				l, _ := namespaceLabels(ctx, c, name)
				labels[name] = l
				return l
			}
			if len(cfgs) > 0 {
				if err := sidecar.CheckPods(cmd.OutOrStdout(), cfgs, params, sites, nsLabels); err != nil {
					return err
				}
			}
			if len(broken) > 0 {
				return fmt.Errorf("%d of %d SidecarInjectors not checked: they do not compile", len(broken), len(broken)+len(cfgs))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&file, "filename", "f", "", "manifest with pods or workloads, - for stdin")
	fs.StringVar(&live, "live", "", "name of a running pod (in -n NAMESPACE): would it get the current revision, and what would change")
	src.addFlags(fs, "")
	src.cluster.addFlags(fs, "default", "namespace of the pod (and of manifest objects that name none)")
	return cmd
}
