// Package serverpolicy decides where the operator may run a CR's webhook
// server and with which image, so that whoever may write a SidecarInjector
// or NodeOversell cannot make the operator run an image of their choice in
// a namespace of their choice with a Secret of their choice mounted (a
// confused deputy: the operator acts with its own privileges, not theirs).
//
// The policy is the operator's flags, one place a platform team audits:
// --allowed-server-namespaces (exact namespace names) and
// --allowed-server-images (exact references, or prefixes ending in "*"
// right after "/", ":" or "@"). The validating webhook denies a CR that
// breaks it and the reconciler refuses to act on one (a CR admitted before
// the webhook existed, or while it was down).
//
// It must not import any hookwright package but api/v1alpha1, nor a
// Kubernetes client: it is a pure decision.
package serverpolicy

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Flag names, quoted in denials so the reader knows what to change.
const (
	NamespacesFlag = "--allowed-server-namespaces"
	ImagesFlag     = "--allowed-server-images"
)

// ReservedSecretNames are the operator's own Secrets (controllers.CASecretName
// and controllers.ManagerCertSecretName): never a user's serving Secret.
var ReservedSecretNames = []string{"hookwright-ca", "hookwright-webhook-server-cert"}

// ReservedSecretPrefixes start the names of the Secrets the operator writes
// for CRs (controllers.Kind.BaseName): another CR's serving key is not a
// user's serving Secret either.
var ReservedSecretPrefixes = []string{"hookwright-sidecar-", "hookwright-oversell-"}

// Policy is where and what the operator may run. Build it with New.
type Policy struct {
	// DefaultNamespace is the server namespace when spec.server.namespace
	// is empty (the operator's namespace).
	DefaultNamespace string
	// DefaultImage is the server image when spec.server.image is empty
	// (--server-image); it is always allowed: the operator chose it.
	DefaultImage string
	// Namespaces are the allowed server namespaces, exact names.
	Namespaces []string
	// Images are the allowed image patterns (see matchImage).
	Images []string
}

// New builds a Policy. Empty namespaces means only defaultNamespace; empty
// images means only defaultImage. An image pattern with a "*" anywhere but
// at the end after "/", ":" or "@" is an error: "ghcr.io/org*" would also
// allow "ghcr.io/org.attacker.example/x".
func New(defaultNamespace, defaultImage string, namespaces, images []string) (Policy, error) {
	p := Policy{DefaultNamespace: defaultNamespace, DefaultImage: defaultImage}
	for _, ns := range namespaces {
		if ns = strings.TrimSpace(ns); ns != "" && !slices.Contains(p.Namespaces, ns) {
			p.Namespaces = append(p.Namespaces, ns)
		}
	}
	if len(p.Namespaces) == 0 && defaultNamespace != "" {
		p.Namespaces = []string{defaultNamespace}
	}
	for _, img := range images {
		img = strings.TrimSpace(img)
		if img == "" {
			continue
		}
		if err := checkPattern(img); err != nil {
			return Policy{}, fmt.Errorf("%s: %w", ImagesFlag, err)
		}
		if !slices.Contains(p.Images, img) {
			p.Images = append(p.Images, img)
		}
	}
	if len(p.Images) == 0 && defaultImage != "" {
		p.Images = []string{defaultImage}
	}
	return p, nil
}

func checkPattern(p string) error {
	i := strings.IndexByte(p, '*')
	switch {
	case i < 0:
		return nil
	case i != len(p)-1:
		return fmt.Errorf("image pattern %q: \"*\" is only allowed at the end", p)
	case p == "*":
		return nil // any image: an explicit, visible choice
	case !strings.ContainsAny(p[i-1:i], "/:@"):
		return fmt.Errorf("image pattern %q: a trailing \"*\" must follow \"/\", \":\" or \"@\"", p)
	}
	return nil
}

// matchImage reports whether image matches pattern: equal, or, for a
// pattern ending in "*", starting with the pattern without it ("*" alone
// matches any image).
func matchImage(pattern, image string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(image, prefix)
	}
	return image == pattern
}

// namespace is the effective server namespace of server.
func (p Policy) namespace(server v1alpha1.ServerSpec) string {
	if server.Namespace != "" {
		return server.Namespace
	}
	return p.DefaultNamespace
}

// allowsNamespace reports whether ns is an allowed server namespace.
func (p Policy) allowsNamespace(ns string) bool { return slices.Contains(p.Namespaces, ns) }

// Check returns what the CR's server and certificate specs break, each
// error naming the field (spec.server.namespace, spec.server.image,
// spec.certificate.secretName) and the rule; nil when allowed.
func (p Policy) Check(server v1alpha1.ServerSpec, cert v1alpha1.CertificateSpec) field.ErrorList {
	var errs field.ErrorList
	if ns := p.namespace(server); !p.allowsNamespace(ns) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "server", "namespace"), fmt.Sprintf(
			"%q is not an allowed server namespace (operator flag %s: %s)", ns, NamespacesFlag, strings.Join(p.Namespaces, ","))))
	}
	if img := server.Image; img != "" && img != p.DefaultImage && !slices.ContainsFunc(p.Images, func(pat string) bool { return matchImage(pat, img) }) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "server", "image"), fmt.Sprintf(
			"%q is not an allowed server image (operator flags --server-image: %s, %s: %s)", img, p.DefaultImage, ImagesFlag, strings.Join(p.Images, ","))))
	}
	if cert.Mode == v1alpha1.CertificateSecret && reservedSecret(cert.SecretName) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "certificate", "secretName"), fmt.Sprintf(
			"%q is a Secret the operator owns (%s, or a name starting with %s): a serving Secret is the user's own",
			cert.SecretName, strings.Join(ReservedSecretNames, ", "), strings.Join(ReservedSecretPrefixes, " or "))))
	}
	return errs
}

func reservedSecret(name string) bool {
	if slices.Contains(ReservedSecretNames, name) {
		return true
	}
	return slices.ContainsFunc(ReservedSecretPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}
