package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/fleet"
	"github.com/hookwright/hookwright/webhooks/sidecar"
)

// offlineKubeVersion is assumed for nativeSidecars Auto when no cluster is
// asked: the Kubernetes minor these libraries are built against.
const offlineKubeVersion = "v1.37.0"

// injectorSource is how status, check-inject and kube-inject find
// SidecarInjectors and the cluster: from a file (--config, offline) or
// from the cluster (--injector, or every one).
type injectorSource struct {
	injector          string
	configFile        string
	kubeVersion       string
	operatorNamespace string
	// excludedNamespaces are the operator's --excluded-namespaces
	// (spared installation-wide), given to the CLI by the same flag.
	excludedNamespaces []string
	cluster            clusterFlags

	// client, when set, is used instead of dialing the cluster (tests).
	client client.Client
}

// addFlags adds the flags choosing the SidecarInjector; the cluster's are
// cluster.addFlags, since each command has its own -n.
func (s *injectorSource) addFlags(fs *pflag.FlagSet, defaultInjector string) {
	fs.StringVar(&s.injector, "injector", defaultInjector, "name of the SidecarInjector to read from the cluster")
	fs.StringVar(&s.configFile, "config", "", "read the SidecarInjector from this YAML/JSON file instead of the cluster")
	fs.StringVar(&s.kubeVersion, "kube-version", "", "Kubernetes version for nativeSidecars Auto (default: the cluster's, or "+offlineKubeVersion+" with --config)")
	s.addNamespaceFlags(fs)
}

// addNamespaceFlags adds --operator-namespace and --excluded-namespaces.
func (s *injectorSource) addNamespaceFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.operatorNamespace, "operator-namespace", envOr("POD_NAMESPACE", "hookwright-system"), "namespace of the operator; never injected")
	fs.StringSliceVar(&s.excludedNamespaces, "excluded-namespaces", envList("EXCLUDED_NAMESPACES"),
		"the operator's --excluded-namespaces (its EXCLUDED_NAMESPACES env): pods there are spared, not counted as missing")
}

// settings are the operator settings an injector is built with. The CLI
// knows the operator's namespace and, from --excluded-namespaces, the
// namespaces spared installation-wide: the allowed server namespaces are
// the manager's flags, not read from its Deployment.
func (s *injectorSource) settings() desired.Settings {
	return desired.Settings{Namespace: s.operatorNamespace, ExcludedNamespaces: s.excludedNamespaces}
}

// restConfig is cluster.restConfig, whose no-cluster error also names the
// offline way out.
func (s *injectorSource) restConfig() (*rest.Config, error) {
	cfg, err := s.cluster.restConfig()
	if errors.Is(err, errNoCluster) {
		return nil, fmt.Errorf("no cluster configured: use --config FILE to work offline, or --kubeconfig FILE (or $KUBECONFIG) to read SidecarInjectors from a cluster")
	}
	return cfg, err
}

// clusterClient dials the cluster once, and asks its version unless
// --kube-version gave one.
func (s *injectorSource) clusterClient() (client.Client, error) {
	if s.client != nil {
		return s.client, nil
	}
	cfg, err := s.restConfig()
	if err != nil {
		return nil, err
	}
	if s.client, err = clientFor(cfg); err != nil {
		return nil, err
	}
	if s.kubeVersion == "" {
		if s.kubeVersion, err = serverVersion(cfg); err != nil {
			return nil, fmt.Errorf("reading the API server version (set --kube-version): %w", err)
		}
	}
	return s.client, nil
}

// injectorQuery says which SidecarInjectors a command reads.
type injectorQuery struct {
	// file, when set, is read instead of the cluster ("-" for stdin): the
	// one SidecarInjector it holds.
	file string
	// names are read from the cluster, in this order; none means every one.
	names []string
	// noneOK: a cluster without SidecarInjectors is an empty answer, not
	// an error (status prints "no SidecarInjectors").
	noneOK bool
	// missingOK: a named one the cluster lacks is left out instead of
	// being an error (what-if's copy in the cluster).
	missingOK bool
}

// query is the query of --config and --injector: the file's, the one
// named, or every one.
func (s *injectorSource) query() injectorQuery {
	q := injectorQuery{file: s.configFile}
	if s.injector != "" {
		q.names = []string{s.injector}
	}
	return q
}

// loadInjectors is the one way every command reads SidecarInjectors: from
// q.file without touching the cluster, or from the cluster. Errors: the
// file unreadable, or not one SidecarInjector (prefixed with its name);
// the cluster unreachable or the list refused ("list SidecarInjectors:
// ..."); a named one missing ("SidecarInjector NAME not found in the
// cluster") or refused ("SidecarInjector NAME: ..."); every one asked and
// there is none ("no SidecarInjector in the cluster").
func (s *injectorSource) loadInjectors(ctx context.Context, q injectorQuery) ([]*v1alpha1.SidecarInjector, error) {
	if q.file != "" {
		b, err := readInput(q.file)
		if err != nil {
			return nil, err
		}
		cr, err := sidecar.DecodeSidecarInjector(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", q.file, err)
		}
		return []*v1alpha1.SidecarInjector{cr}, nil
	}
	c, err := s.clusterClient()
	if err != nil {
		return nil, err
	}
	var out []*v1alpha1.SidecarInjector
	if len(q.names) == 0 {
		var list v1alpha1.SidecarInjectorList
		if err := c.List(ctx, &list); err != nil {
			return nil, fmt.Errorf("list SidecarInjectors: %w", err)
		}
		if len(list.Items) == 0 && !q.noneOK {
			return nil, fmt.Errorf("no SidecarInjector in the cluster")
		}
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
		return out, nil
	}
	for _, name := range q.names {
		cr := &v1alpha1.SidecarInjector{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, cr)
		switch {
		case apierrors.IsNotFound(err) && q.missingOK:
			continue
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("SidecarInjector %s not found in the cluster", name)
		case err != nil:
			return nil, fmt.Errorf("SidecarInjector %s: %w", name, err)
		}
		out = append(out, cr)
	}
	return out, nil
}

// load returns the compiled configs of --config or --injector (every
// SidecarInjector without either), built by fleet.NewInjector as the
// servers serve them, and the engine parameters. When every
// SidecarInjector of the cluster is read, one that does not compile is
// returned in broken (its error names it) and the others still load; a
// single named or file config that does not compile is an error.
func (s *injectorSource) load(ctx context.Context) (cfgs []*sidecar.Config, broken []error, p sidecar.Params, err error) {
	q := s.query()
	crs, err := s.loadInjectors(ctx, q)
	if err != nil {
		return nil, nil, sidecar.Params{}, err
	}
	if q.file != "" && s.kubeVersion == "" {
		s.kubeVersion = offlineKubeVersion
	}
	listed := q.file == "" && len(q.names) == 0
	for _, cr := range crs {
		// What the servers serve: the pinned revision once resolved.
		inj, err := fleet.NewInjector(cr, s.settings(), s.kubeVersion)
		if err != nil {
			err = fmt.Errorf("SidecarInjector %s: %w", cr.Name, err)
			if !listed {
				return nil, nil, sidecar.Params{}, err
			}
			broken = append(broken, err)
			continue
		}
		cfgs = append(cfgs, inj.Config)
	}
	// One Params serves every config: the namespaces spared are those of
	// --excluded-namespaces; cert-manager's (mode CertManager) is per
	// injector and only status and check-inject --live, which build
	// each injector's own Params, report it as spared.
	return cfgs, broken, sidecar.Params{OperatorNamespace: s.operatorNamespace, SparedNamespaces: s.excludedNamespaces, ServerVersion: s.kubeVersion}, nil
}

func readInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}
