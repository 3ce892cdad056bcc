package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

func init() {
	subcommands = append(subcommands, newRotateCACommand, newRenewCertificateCommand)
}

// annotate sets one annotation with a merge patch (no read-modify-write:
// nothing else of the object is touched) in the cluster of k.
func annotate(cmd *cobra.Command, k *clusterFlags, obj client.Object, key, value string) error {
	c, _, err := k.newClient()
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		return err
	}
	return c.Patch(cmd.Context(), obj, client.RawPatch(types.MergePatchType, patch))
}

func newRotateCACommand() *cobra.Command {
	var cluster clusterFlags
	cmd := &cobra.Command{
		Use:   "rotate-ca [--namespace NS]",
		Short: "Start a rotation of the installation CA now, with the usual overlap",
		Long: `Annotate the installation CA Secret (` + desired.CASecretName + ` in the operator namespace)
with ` + v1alpha1.AnnotationRotateCA + `=<now>. The operator then stages a new CA at
once, publishes it in every caBundle and ClusterTrustBundle, lets it sign only
after that, re-issues every serving certificate, and drops the old CA once
nothing it signed is served, as in a scheduled rotation. Like cmctl renew;
for incident response, or to exercise rotation in a running cluster.
Equivalent: kubectl -n NS annotate secret ` + desired.CASecretName + ` ` + v1alpha1.AnnotationRotateCA + `="$(date -u +%FT%TZ)" --overwrite`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns := cluster.namespace()
			token := time.Now().UTC().Format(time.RFC3339Nano)
			sec := &corev1.Secret{}
			sec.Namespace, sec.Name = ns, desired.CASecretName
			if err := annotate(cmd, &cluster, sec, v1alpha1.AnnotationRotateCA, token); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "secret %s/%s annotated %s=%s\n", ns, desired.CASecretName, v1alpha1.AnnotationRotateCA, token)
			return nil
		},
	}
	cluster.addFlags(cmd.Flags(), envOr("POD_NAMESPACE", "hookwright-system"), "operator namespace (holds the CA Secret)")
	return cmd
}

func newRenewCertificateCommand() *cobra.Command {
	var cluster clusterFlags
	cmd := &cobra.Command{
		Use:   "renew-certificate (sidecarinjector|nodeoversell)/NAME",
		Short: "Re-issue the serving certificate of one SidecarInjector or NodeOversell now",
		Long: `Annotate the CR with ` + v1alpha1.AnnotationRenewCertificate + `=<now>. In mode SelfSigned the
operator issues a new serving certificate from the active CA, in mode CSR it
requests one with a new CertificateSigningRequest; the old one is served
until the new one is, and its CA stays in the caBundle until pods reloaded.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, ok := strings.Cut(args[0], "/")
			var obj client.Object
			switch strings.ToLower(kind) {
			case "sidecarinjector", "sidecarinjectors":
				obj = &v1alpha1.SidecarInjector{}
			case "nodeoversell", "nodeoversells":
				obj = &v1alpha1.NodeOversell{}
			}
			if !ok || obj == nil || name == "" {
				return fmt.Errorf("want sidecarinjector/NAME or nodeoversell/NAME, got %q", args[0])
			}
			obj.SetName(name)
			token := time.Now().UTC().Format(time.RFC3339Nano)
			if err := annotate(cmd, &cluster, obj, v1alpha1.AnnotationRenewCertificate, token); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s annotated %s=%s\n", args[0], v1alpha1.AnnotationRenewCertificate, token)
			return nil
		},
	}
	// Both kinds are cluster-scoped: no -n.
	cluster.addFlags(cmd.Flags(), "", "")
	return cmd
}
