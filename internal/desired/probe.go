package desired

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/webhookprobe"
)

// labelProbe marks the operator's probe namespaces and the dry-run pods it
// creates there.
const labelProbe = "admission.hookwright.io/probe"

// ProbeNamespaceName is the namespace where the operator probes a
// SidecarInjector's webhook: "hookwright-probe-<crName>", shortened and
// suffixed as BaseName does when too long for a namespace name (a DNS-1123
// label of at most 63 characters).
func ProbeNamespaceName(crName string) string {
	name := "hookwright-probe-" + crName
	clean := strings.ReplaceAll(name, ".", "-")
	if clean == name && len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(crName))
	if len(clean) > 63-9 {
		clean = strings.TrimRight(clean[:63-9], "-")
	}
	return clean + "-" + hex.EncodeToString(sum[:4])
}

// ProbeNamespace is the SidecarInjector's probe namespace, one per CR and
// owned by it (the garbage collector deletes it with the CR): labelled so
// that the CR's namespaceSelector selects it, which one shared namespace
// could not be for every selector. It holds nothing: the probe's pods are
// server-side dry-run creates, never stored. It fails when no labels
// satisfy the namespaceSelector.
func ProbeNamespace(si *v1alpha1.SidecarInjector) (*corev1.Namespace, error) {
	op := SidecarCR(si)
	base := map[string]string{LabelManagedBy: ManagedByValue, labelName: "hookwright-probe", LabelInstance: op.Base(), labelProbe: "true"}
	l, err := webhookprobe.Satisfying(si.Spec.NamespaceSelector, base)
	if err != nil {
		return nil, fmt.Errorf("no probe namespace: spec.namespaceSelector: %w", err)
	}
	// The operator's cache and ownership need these, whatever the selector.
	l[LabelManagedBy], l[LabelInstance] = ManagedByValue, op.Base()
	return &corev1.Namespace{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{
			Name: ProbeNamespaceName(si.Name), Labels: l,
			OwnerReferences: []metav1.OwnerReference{ownerReference(op)},
		},
	}, nil
}

// ProbePod is the pod the operator creates with dryRun=All in the probe
// namespace: labelled so that the CR's objectSelector selects it and the
// inject label opts it in (which wins over never/alwaysInjectSelector and
// the policy, webhooks/sidecar Decide), with a restricted security
// context and no service account token.
func ProbePod(si *v1alpha1.SidecarInjector, image string) (*corev1.Pod, error) {
	l, err := webhookprobe.Satisfying(si.Spec.ObjectSelector, map[string]string{labelProbe: "true"})
	if err != nil {
		return nil, fmt.Errorf("no probe pod: spec.objectSelector: %w", err)
	}
	l[v1alpha1.SidecarInjectKey] = "true"
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hookwright-probe", Namespace: ProbeNamespaceName(si.Name), Labels: l},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "probe", Image: image,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}, nil
}
