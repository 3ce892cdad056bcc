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

func newCheckInjectCommand() *cobra.Command {
	var (
		src       injectorSource
		file, ns  string
		nsFlagSet bool
	)
	cmd := &cobra.Command{
		Use:   "check-inject (-f POD.yaml | -n NS POD) [--injector NAME | --config CR.yaml]",
		Short: "Tell whether pods would be injected, and by which rule",
		Long: `For a pod in the cluster (-n NS POD) or every pod and pod template in a
manifest (-f FILE), print whether each SidecarInjector would inject it and
the exact deciding rule: system or operator namespace, namespaceSelector,
objectSelector, hostNetwork, the inject label or annotation (and ignored
values), never/alwaysInjectSelector, policy. It also points out inject keys
placed on a workload's own metadata instead of its pod template. Without
--injector or --config every SidecarInjector in the cluster is checked.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			nsFlagSet = cmd.Flags().Changed("namespace")
			if (file == "") == (len(args) == 0) {
				return fmt.Errorf("give either -f FILE or a pod name (with -n NAMESPACE)")
			}
			src.all = true
			ctx := cmd.Context()
			cfgs, params, err := src.load(ctx)
			if err != nil {
				return err
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
				if !nsFlagSet {
					ns = "default"
				}
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
				nsObj := &corev1.Namespace{}
				if err := c.Get(ctx, client.ObjectKey{Name: name}, nsObj); err != nil {
					labels[name] = nil
					return nil
				}
				l := nsObj.Labels
				if l == nil {
					l = map[string]string{}
				}
				labels[name] = l
				return l
			}
			return sidecar.CheckPods(cmd.OutOrStdout(), cfgs, params, sites, nsLabels)
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&file, "filename", "f", "", "manifest with pods or workloads, - for stdin")
	fs.StringVarP(&ns, "namespace", "n", "default", "namespace of the pod (and of manifest objects that name none)")
	src.addFlags(fs, "")
	return cmd
}
