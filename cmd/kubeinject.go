package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

func init() {
	subcommands = append(subcommands, newKubeInjectCommand)
}

// offlineKubeVersion is assumed for nativeSidecars Auto when no cluster is
// asked: the Kubernetes minor these libraries are built against.
const offlineKubeVersion = "v1.37.0"

// injectorSource is how kube-inject and check-inject find SidecarInjectors:
// from a file (--config, offline) or from the cluster (--injector).
type injectorSource struct {
	injector          string
	configFile        string
	kubeVersion       string
	operatorNamespace string
	kubeconfig        string
	kubeContext       string
	// all: with neither flag set, check-inject uses every SidecarInjector.
	all bool

	client client.Client
}

func (s *injectorSource) addFlags(fs *pflag.FlagSet, defaultInjector string) {
	fs.StringVar(&s.injector, "injector", defaultInjector, "name of the SidecarInjector to read from the cluster")
	fs.StringVar(&s.configFile, "config", "", "read the SidecarInjector from this YAML/JSON file instead of the cluster")
	fs.StringVar(&s.kubeVersion, "kube-version", "", "Kubernetes version for nativeSidecars Auto (default: the cluster's, or "+offlineKubeVersion+" with --config)")
	fs.StringVar(&s.operatorNamespace, "operator-namespace", envOr("POD_NAMESPACE", "hookwright-system"), "namespace of the operator; never injected")
	fs.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else ~/.kube/config, else in-cluster)")
	fs.StringVar(&s.kubeContext, "context", "", "kubeconfig context to use (default its current context)")
}

// settings are the operator settings an injector is built with. The CLI
// knows the operator's namespace only: the allowed server namespaces are
// the manager's flags.
func (s *injectorSource) settings() desired.Settings {
	return desired.Settings{Namespace: s.operatorNamespace}
}

// restConfig loads the cluster's client config with client-go's standard
// rules: --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the
// in-cluster service account; --context picks the context.
func (s *injectorSource) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = s.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: s.kubeContext})
	cfg, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, fmt.Errorf("no cluster configured: use --config FILE to work offline, or --kubeconfig FILE (or $KUBECONFIG) to read SidecarInjectors from a cluster")
	}
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	return cfg, nil
}

func (s *injectorSource) clusterClient() (client.Client, error) {
	if s.client != nil {
		return s.client, nil
	}
	cfg, err := s.restConfig()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if s.client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if s.kubeVersion == "" {
		if s.kubeVersion, err = serverVersion(cfg); err != nil {
			return nil, fmt.Errorf("reading the API server version (set --kube-version): %w", err)
		}
	}
	return s.client, nil
}

// load returns the compiled configs and the engine parameters. When every
// SidecarInjector of the cluster is read (check-inject without --injector),
// one that does not compile is returned in broken (its error names it) and
// the others still load; a single named or file config that does not
// compile is an error.
func (s *injectorSource) load(ctx context.Context) (cfgs []*sidecar.Config, broken []error, p sidecar.Params, err error) {
	var crs []*v1alpha1.SidecarInjector
	if s.configFile != "" {
		b, err := readInput(s.configFile)
		if err != nil {
			return nil, nil, sidecar.Params{}, err
		}
		cr, err := sidecar.DecodeSidecarInjector(b)
		if err != nil {
			return nil, nil, sidecar.Params{}, fmt.Errorf("%s: %w", s.configFile, err)
		}
		crs = append(crs, cr)
		if s.kubeVersion == "" {
			s.kubeVersion = offlineKubeVersion
		}
	} else {
		c, err := s.clusterClient()
		if err != nil {
			return nil, nil, sidecar.Params{}, err
		}
		if s.all && s.injector == "" {
			var list v1alpha1.SidecarInjectorList
			if err := c.List(ctx, &list); err != nil {
				return nil, nil, sidecar.Params{}, err
			}
			for i := range list.Items {
				crs = append(crs, &list.Items[i])
			}
			if len(crs) == 0 {
				return nil, nil, sidecar.Params{}, fmt.Errorf("no SidecarInjector in the cluster")
			}
		} else {
			cr := &v1alpha1.SidecarInjector{}
			if err := c.Get(ctx, client.ObjectKey{Name: s.injector}, cr); err != nil {
				return nil, nil, sidecar.Params{}, fmt.Errorf("SidecarInjector %s: %w", s.injector, err)
			}
			crs = append(crs, cr)
		}
	}
	listed := s.all && s.injector == "" && s.configFile == ""
	for _, cr := range crs {
		cfg, err := sidecar.Compile(cr)
		if err != nil {
			err = fmt.Errorf("SidecarInjector %s: %w", cr.Name, err)
			if !listed {
				return nil, nil, sidecar.Params{}, err
			}
			broken = append(broken, err)
			continue
		}
		cfgs = append(cfgs, cfg)
	}
	return cfgs, broken, sidecar.Params{OperatorNamespace: s.operatorNamespace, ServerVersion: s.kubeVersion}, nil
}

func readInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

func newKubeInjectCommand() *cobra.Command {
	var (
		src                   injectorSource
		file, output, defNSFl string
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
			if err := sidecar.InjectStream(cfgs[0], params, bytes.NewReader(in), &out, defNSFl, warn); err != nil {
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
	fs.StringVarP(&defNSFl, "namespace", "n", "default", "namespace assumed for objects that name none")
	src.addFlags(fs, "sidecar-injector")
	return cmd
}
