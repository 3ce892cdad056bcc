package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/cmd/app"
)

// errNoCluster is returned by clusterFlags.restConfig when no kubeconfig
// is found and the command does not run in a pod.
var errNoCluster = errors.New("no cluster configured: set --kubeconfig FILE or $KUBECONFIG, or write ~/.kube/config")

// clusterFlags is how every command that talks to a cluster finds it and
// builds its client: kubectl's standard flags (--kubeconfig, --context,
// --cluster, --user, -s/--server, --token, --as, --as-group, --as-uid,
// --certificate-authority, --client-certificate, --client-key,
// --insecure-skip-tls-verify, --tls-server-name, --request-timeout, and
// -n/--namespace where the command has a namespace), parsed and resolved by
// cli-runtime's ConfigFlags with kubectl's loading rules (--kubeconfig,
// else $KUBECONFIG, else ~/.kube/config, else the in-cluster service
// account), so `kubectl hookwright ...` takes what kubectl takes. The zero
// value reads the defaults.
type clusterFlags struct {
	flags *genericclioptions.ConfigFlags
	// namespaceDefault is -n's value when the command has no -n.
	namespaceDefault string
}

// configFlags is kubectl's flag set; a nil Namespace is neither added as
// a flag nor applied (cluster-scoped commands have no -n).
func (k *clusterFlags) configFlags() *genericclioptions.ConfigFlags {
	if k.flags == nil {
		k.flags = genericclioptions.NewConfigFlags(true)
		k.flags.Namespace = nil
	}
	return k.flags
}

// addFlags adds kubectl's flags to fs and, when nsUsage is not empty,
// -n/--namespace defaulting to nsDefault. A command on cluster-scoped
// objects only passes "" and gets no -n.
func (k *clusterFlags) addFlags(fs *pflag.FlagSet, nsDefault, nsUsage string) {
	cf := k.configFlags()
	k.namespaceDefault = nsDefault
	if nsUsage != "" {
		cf.Namespace = ptr.To(nsDefault)
	}
	cf.AddFlags(fs)
	setKubeconfigUsage(fs)
	if nsUsage != "" {
		fs.Lookup("namespace").Usage = nsUsage
	}
}

// addServerFlags adds only --kubeconfig and --context, for the servers
// (manager, injector, oversell): in their pods they use the service
// account, and kubectl's other flags have no use there (--request-timeout
// would also cut their watches). Their namespace flags are their own
// (--namespace, --operator-namespace), set by their Deployments.
func (k *clusterFlags) addServerFlags(fs *pflag.FlagSet) {
	k.flags = &genericclioptions.ConfigFlags{KubeConfig: ptr.To(""), Context: ptr.To("")}
	k.flags.AddFlags(fs)
	setKubeconfigUsage(fs)
}

// setKubeconfigUsage words the defaults, which kubectl's help leaves out.
func setKubeconfigUsage(fs *pflag.FlagSet) {
	fs.Lookup("kubeconfig").Usage = "kubeconfig file (default $KUBECONFIG, else ~/.kube/config, else in-cluster)"
	fs.Lookup("context").Usage = "kubeconfig context to use (default its current context)"
}

// namespace is -n's value, or the command's default. Not the kubeconfig
// context's namespace: each command's -n keeps the default it documents.
func (k *clusterFlags) namespace() string {
	if k.flags != nil && k.flags.Namespace != nil {
		return *k.flags.Namespace
	}
	return k.namespaceDefault
}

// restConfig is the client config of the chosen kubeconfig and context.
// Errors: errNoCluster when there is no configuration at all; otherwise
// client-go's (a missing kubeconfig file, an unknown context), prefixed
// "loading kubeconfig".
func (k *clusterFlags) restConfig() (*rest.Config, error) {
	cf := k.configFlags()
	raw, err := cf.ToRawKubeConfigLoader().RawConfig()
	server := cf.APIServer != nil && *cf.APIServer != ""
	if err == nil && clientcmdapi.IsConfigEmpty(&raw) && !server && !inCluster() {
		// ConfigFlags would dial http://localhost:8080, client-go's
		// deprecated default: say what is missing instead.
		return nil, errNoCluster
	}
	cfg, err := cf.ToRESTConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, errNoCluster
	}
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	if cfg.QPS == 0 {
		// No client-side rate limit, as controller-runtime's GetConfig
		// (which the servers used) has it: the API server's priority
		// and fairness limits us.
		cfg.QPS = -1
	}
	return cfg, nil
}

// inCluster tells whether the in-cluster service account is there, which
// client-go uses when no kubeconfig is found.
func inCluster() bool {
	_, err := rest.InClusterConfig()
	return err == nil
}

// newClient is a controller-runtime client of the chosen cluster (see
// clientFor), and its config. Errors are restConfig's or clientFor's.
func (k *clusterFlags) newClient() (client.Client, *rest.Config, error) {
	cfg, err := k.restConfig()
	if err != nil {
		return nil, nil, err
	}
	c, err := clientFor(cfg)
	return c, cfg, err
}

// clientFor is the one controller-runtime client builder of the CLI: a
// client of cfg knowing every type the operator uses (app.NewScheme)
// and CustomResourceDefinitions (check reads ours).
func clientFor(cfg *rest.Config) (client.Client, error) {
	scheme, err := app.NewScheme()
	if err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}
