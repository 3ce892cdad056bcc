// Command hookwright is the single binary of the project: the operator
// (manager), the two webhook servers (injector, oversell) and the CLI tools.
//
// It is wiring only: flags, managers and handlers from the packages below.
// It must not import hack/ (image, bundle and demo tooling) or anything
// under test/: the operator image carries neither (TestOperatorBinaryDoesNotLinkImages).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
)

// subcommands is filled by init functions of the files in this package, so
// each subcommand lives in its own file.
var subcommands []func() *cobra.Command

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "hookwright",
		Short:         "Kubernetes operator running the SidecarInjector and NodeOversell admission webhooks",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	if pluginName(os.Args[0]) {
		// Help and completion say "kubectl hookwright" when kubectl runs
		// this binary as its plugin (kubectl's plugin handler execs
		// kubectl-hookwright with the arguments after "hookwright").
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl hookwright"}
	}
	for _, f := range subcommands {
		root.AddCommand(f())
	}
	return root
}

// pluginName tells whether arg0 names the binary as kubectl's plugin
// (kubectl-hookwright, as make kubectl-plugin and krew install it).
func pluginName(arg0 string) bool {
	return strings.HasPrefix(filepath.Base(arg0), "kubectl-")
}

func main() {
	if err := newRootCommand().ExecuteContext(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
