package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func init() {
	subcommands = append(subcommands, newKubeInjectCommand)
}

func newKubeInjectCommand() *cobra.Command {
	var (
		src          injectorSource
		file, output string
	)
	cmd := &cobra.Command{
		Use:   "kube-inject -f FILE|- [--injector NAME | --config CR.yaml] [-o FILE]",
		Short: "Inject sidecars into manifests, as the webhook would",
		Long: `Read a multi-document YAML (or JSON) stream and inject sidecars into every
Pod, Deployment, DaemonSet, StatefulSet, ReplicaSet, ReplicationController,
Job and CronJob, also inside v1 Lists. Other kinds, and objects that are not
injected, are written back unchanged byte for byte, so running kube-inject on
its own output changes nothing. Skips and ignored values go to stderr.
The SidecarInjector comes from the cluster (--injector) or a file (--config).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("-f FILE (or - for stdin) is required")
			}
			if src.injector == "" && src.configFile == "" {
				return fmt.Errorf("--injector NAME or --config FILE is required")
			}
			cfgs, _, params, err := src.load(cmd.Context())
			if err != nil {
				return err
			}
			in, err := readInput(file)
			if err != nil {
				return err
			}
			var out bytes.Buffer
			warn := func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), "warning:", s) }
			if err := sidecar.InjectStream(cfgs[0], params, bytes.NewReader(in), &out, src.cluster.namespace(), warn); err != nil {
				return err
			}
			if output == "" || output == "-" {
				_, err := cmd.OutOrStdout().Write(out.Bytes())
				return err
			}
			// Written only after the whole input was processed, so -o may name the input.
			return os.WriteFile(output, out.Bytes(), 0o644)
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&file, "filename", "f", "", "manifest file to inject, - for stdin")
	fs.StringVarP(&output, "output", "o", "", "write the result to this file (default stdout)")
	src.addFlags(fs, "sidecar-injector")
	src.cluster.addFlags(fs, "default", "namespace assumed for objects that name none")
	return cmd
}
