package desired

import (
	"fmt"
	"maps"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// SystemNamespaces are never sent to the sidecar injector: a webhook outage
// must not stop the control plane's pods from starting.
var SystemNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// Desired is every object one CR owns, built by BuildSidecarInjector or
// BuildNodeOversell. The serving certificate Secret is built separately
// (ServingSecret) because its content depends on certificate state.
type Desired struct {
	ServiceAccount      *corev1.ServiceAccount
	ClusterRole         *rbacv1.ClusterRole
	ClusterRoleBinding  *rbacv1.ClusterRoleBinding
	Deployment          *appsv1.Deployment
	PodDisruptionBudget *policyv1.PodDisruptionBudget // nil when replicas is 1
	Service             *corev1.Service
	Webhook             *admissionregistrationv1.MutatingWebhookConfiguration
}

// Objects lists the non-nil objects in apply order: identity and RBAC before
// the Deployment that uses them, the webhook configuration last so the API
// server is only pointed at a Service once it exists.
func (d *Desired) Objects() []Object {
	out := []Object{d.ServiceAccount, d.ClusterRole, d.ClusterRoleBinding, d.Deployment}
	if d.PodDisruptionBudget != nil {
		out = append(out, d.PodDisruptionBudget)
	}
	return append(out, d.Service, d.Webhook)
}

// defaultResources of the server container when spec.server.resources is
// unset: requests sized from the webhook benchmarks (a few ms of CPU per
// thousand reviews), a memory limit and no CPU limit (throttling a webhook
// turns into API latency).
func defaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("50m"),
			corev1.ResourceMemory: resource.MustParse("64Mi"),
		},
		Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
}

// BuildSidecarInjector returns the objects a SidecarInjector owns. The
// webhook configuration has no caBundle: internal/certificates/sources.Publish
// writes it.
func BuildSidecarInjector(si *v1alpha1.SidecarInjector, s Settings) *Desired {
	op := SidecarCR(si)
	args := []string{"injector", "--injector=" + si.Name, "--operator-namespace=" + s.Namespace}
	if s.OperatorDeployment != "" {
		args = append(args, "--operator-deployment="+s.Namespace+"/"+s.OperatorDeployment)
	}
	d := build(op, s, args)

	// The user's namespaceSelector, always narrowed to exclude the control
	// plane's, the operator's and every allowed server namespace, so no
	// injector ever blocks (or mutates) a webhook server's pods, its own or
	// another CR's. The allowed set, not the namespaces in use: a CR moving
	// to another allowed namespace changes no other injector's webhook.
	// kubernetes.io/metadata.name is set on every namespace by the API
	// server (KEP-2161).
	nsSel := &metav1.LabelSelector{}
	if si.Spec.NamespaceSelector != nil {
		nsSel = si.Spec.NamespaceSelector.DeepCopy()
	}
	nsSel.MatchExpressions = append(nsSel.MatchExpressions, metav1.LabelSelectorRequirement{
		Key:      corev1.LabelMetadataName,
		Operator: metav1.LabelSelectorOpNotIn,
		Values:   InjectorExcludedNamespaces(si, s),
	})
	fp := admissionregistrationv1.FailurePolicyType(or(string(si.Spec.FailurePolicy), string(v1alpha1.FailurePolicyFail)))
	rp := admissionregistrationv1.ReinvocationPolicyType(or(string(si.Spec.ReinvocationPolicy), string(admissionregistrationv1.IfNeededReinvocationPolicy)))
	wh := webhook(op, s, fp, or32(si.Spec.TimeoutSeconds, v1alpha1.DefaultSidecarTimeoutSeconds), admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
	})
	wh.NamespaceSelector = nsSel
	wh.ObjectSelector = injectorObjectSelector(si.Spec.ObjectSelector)
	wh.MatchConditions = podMatchConditions()
	wh.ReinvocationPolicy = &rp
	d.Webhook.Webhooks = []admissionregistrationv1.MutatingWebhook{wh}
	// The injector reads only its own SidecarInjector (an informer with a
	// metadata.name field selector, which RBAC matches against resourceNames).
	d.ClusterRole.Rules[0].ResourceNames = []string{si.Name}
	if s.OperatorDeployment != "" {
		d.ClusterRole.Rules = append(d.ClusterRole.Rules, failOpenRules(d.Webhook.Name, s.OperatorDeployment)...)
	}
	return d
}

// failOpenRules let an injector server switch its configuration to Ignore
// once the operator is gone (cmd/failopen.go): get the operator's
// Deployment, get and patch its own MutatingWebhookConfiguration and the
// manager's ValidatingWebhookConfiguration (nobody serves it then, and
// with Fail it refuses CR creates and spec changes). Each names one
// object. The operator holds the same rules cluster-wide
// (controllers/lifecycle.go markers), as RBAC's escalation check requires
// of whoever writes this ClusterRole. Only the injector: a NodeOversell's
// configuration is always Ignore (BuildNodeOversell).
func failOpenRules(config, operatorDeployment string) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{
		APIGroups:     []string{appsv1.GroupName},
		Resources:     []string{"deployments"},
		ResourceNames: []string{operatorDeployment},
		Verbs:         []string{"get"},
	}, {
		APIGroups:     []string{admissionregistrationv1.GroupName},
		Resources:     []string{"mutatingwebhookconfigurations"},
		ResourceNames: []string{config},
		Verbs:         []string{"get", "patch"},
	}, {
		APIGroups:     []string{admissionregistrationv1.GroupName},
		Resources:     []string{"validatingwebhookconfigurations"},
		ResourceNames: []string{ValidatingConfigName},
		Verbs:         []string{"get", "patch"},
	}}
}

// injectorObjectSelector is the user's objectSelector narrowed to skip pods
// labelled sidecar.hookwright.io/inject=false (or another spelling of false):
// the injector would skip them anyway, since the label opt-out wins over
// alwaysInjectSelector and the policy, and now their creation does not
// depend on the injector being up. Only the opt-out is expressed: an
// opt-in-only selector (Istio's objectSelector.autoInject=false) would hide
// from the injector the pods alwaysInjectSelector or an inject annotation
// select.
func injectorObjectSelector(user *metav1.LabelSelector) *metav1.LabelSelector {
	sel := &metav1.LabelSelector{}
	if user != nil {
		sel = user.DeepCopy()
	}
	sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{
		Key:      v1alpha1.SidecarInjectKey,
		Operator: metav1.LabelSelectorOpNotIn,
		Values:   slices.Clone(v1alpha1.SidecarOptOutLabelValues),
	})
	return sel
}

// BuildNodeOversell returns the objects a NodeOversell owns.
//
// The server acts only for this NodeOversell (--node-oversell): it changes
// the nodes this one wins and passes other writes through, so overlapping
// NodeOversells never both amplify a write (webhooks/oversell/chain.go).
// The webhook's objectSelector is the nodeSelector, so a node's heartbeats
// reach only the servers of the NodeOversells selecting it, and unselected
// nodes none. The API server matches it against the node's labels before
// and after the write, so the write that removes a label through
// nodes/status still reaches the server, which restores the node; a label
// removed through nodes, a narrowed selector or a deletion is restored by
// the operator (syncNodes, restoreNodes).
func BuildNodeOversell(no *v1alpha1.NodeOversell, s Settings) *Desired {
	op := OversellCR(no)
	d := build(op, s, []string{"oversell", "--node-oversell=" + no.Name})
	// Always Ignore: the CRD accepts only Ignore, and an object stored with
	// Fail before that rule (kept through updates by validation ratcheting)
	// must not let a server outage block every node's status writes.
	wh := webhook(op, s, admissionregistrationv1.Ignore, or32(no.Spec.TimeoutSeconds, 2), admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes/status"}},
	})
	// An absent nodeSelector selects every node, as an absent objectSelector
	// does. A node some NodeOversell manages (it carries OversellNodeLabel)
	// is left to that one's held. webhook, so a managed node's heartbeat
	// reaches exactly one hookwright webhook and waits at most one
	// timeoutSeconds (at most 5, the CRD says) of the kubelet's 10 s.
	wh.ObjectSelector = no.Spec.NodeSelector.DeepCopy()
	if wh.ObjectSelector == nil {
		wh.ObjectSelector = &metav1.LabelSelector{}
	}
	wh.ObjectSelector.MatchExpressions = append(wh.ObjectSelector.MatchExpressions, metav1.LabelSelectorRequirement{
		Key: v1alpha1.OversellNodeLabel, Operator: metav1.LabelSelectorOpDoesNotExist,
	})
	// The nodes the operator manages for this NodeOversell carry its label
	// (v1alpha1.OversellNodeLabel): a node that left the selector, or one
	// of a NodeOversell being deleted, still reaches the server while the
	// operator holds it for its running pods (webhooks/oversell RouteNode).
	// The first webhook excludes labelled nodes, so the two never both
	// match a node (but for a status write that removes the label itself;
	// the server's answer is idempotent, webhooks/oversell/chain.go).
	held := *wh.DeepCopy()
	held.Name = "held." + op.Kind.WebhookName
	held.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.OversellNodeLabel: no.Name}}
	d.Webhook.Webhooks = []admissionregistrationv1.MutatingWebhook{wh, held}
	return d
}

// InjectorExcludedNamespaces are the namespaces a SidecarInjector's webhook
// configuration keeps from its injector (namespaceSelector NotIn): the
// control plane's, the operator's, the CR's server namespace and every
// allowed server namespace. Passed as sidecar.Params.ExcludedNamespaces,
// they make sidecar.Decide answer for a running pod what the API server and
// the webhook together would at its creation.
// The installation's --excluded-namespaces follow, and in mode CertManager
// cert-manager's namespace: an injector with Fail must not block the
// issuer of its own certificate.
func InjectorExcludedNamespaces(si *v1alpha1.SidecarInjector, s Settings) []string {
	ns := append([]string{s.Namespace, ServerNamespace(SidecarCR(si), s)}, s.ServerPolicy().Namespaces...)
	return excludedNamespaces(append(ns, InjectorSparedNamespaces(si, s)...)...)
}

// InjectorSparedNamespaces are the namespaces spared installation-wide
// (part of InjectorExcludedNamespaces): --excluded-namespaces and, in mode
// CertManager, CertManagerNamespace. Passed as
// sidecar.Params.SparedNamespaces, a pod there is reported as spared
// (v1alpha1.Spared) rather than as the operator's.
func InjectorSparedNamespaces(si *v1alpha1.SidecarInjector, s Settings) []string {
	ns := slices.Clone(s.ExcludedNamespaces)
	if CertificateMode(SidecarCR(si)) == v1alpha1.CertificateCertManager && !slices.Contains(ns, CertManagerNamespace) {
		ns = append(ns, CertManagerNamespace)
	}
	return ns
}

// CertManagerNamespace is where cert-manager's own manifests install it;
// an installation elsewhere names its namespace in --excluded-namespaces.
const CertManagerNamespace = "cert-manager"

// Pod matchConditions of every SidecarInjector webhook: the spared set of
// api/v1alpha1 (SpareMatchConditions), so that the CEL the API server runs
// and sidecar.Decide's answer for a running pod come from one definition.
const (
	MatchNotCritical = v1alpha1.MatchNotCritical
	MatchNotMirror   = v1alpha1.MatchNotMirror
)

// podMatchConditions are the matchConditions of a pod webhook.
func podMatchConditions() []admissionregistrationv1.MatchCondition {
	return v1alpha1.SpareMatchConditions()
}

func excludedNamespaces(namespaces ...string) []string {
	out := slices.Clone(SystemNamespaces)
	for _, ns := range namespaces {
		if ns != "" && !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

func webhook(op CR, s Settings, fp admissionregistrationv1.FailurePolicyType, timeout int32, rule admissionregistrationv1.RuleWithOperations) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name: op.Kind.WebhookName,
		ClientConfig: admissionregistrationv1.WebhookClientConfig{
			Service: &admissionregistrationv1.ServiceReference{
				Namespace: ServerNamespace(op, s),
				Name:      op.Base(),
				Path:      ptr.To(op.Kind.Path),
				Port:      ptr.To[int32](443),
			},
		},
		Rules:                   []admissionregistrationv1.RuleWithOperations{rule},
		FailurePolicy:           &fp,
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To(timeout),
		AdmissionReviewVersions: []string{"v1"},
	}
}

func build(op CR, s Settings, args []string) *Desired {
	name := op.Base()
	ns := ServerNamespace(op, s)
	selector := SelectorLabels(op)
	replicas := defaultReplicas
	if op.Server.Replicas != nil {
		replicas = *op.Server.Replicas
	}
	image := s.Image
	if op.Server.Image != "" {
		image = op.Server.Image
	}
	res := defaultResources()
	if op.Server.Resources != nil {
		res = *op.Server.Resources.DeepCopy()
	}
	args = append(slices.Clone(args),
		"--cert-dir="+serverCertDir,
		fmt.Sprintf("--webhook-port=%d", WebhookPort),
		fmt.Sprintf("--health-probe-bind-address=:%d", probePort),
		fmt.Sprintf("--metrics-bind-address=:%d", MetricsPort),
		"--drain-period="+ServerDrainPeriod.String(),
		"--drain-close-wait="+ServerCloseWait.String(),
	)
	d := &Desired{}
	d.ServiceAccount = &corev1.ServiceAccount{ObjectMeta: meta(op, name, ns)}
	d.ClusterRole = &rbacv1.ClusterRole{
		ObjectMeta: meta(op, name, ""),
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{v1alpha1.GroupVersion.Group},
			Resources: []string{op.Kind.Resource},
			Verbs:     []string{"get", "list", "watch"},
		}},
	}
	d.ClusterRoleBinding = &rbacv1.ClusterRoleBinding{
		ObjectMeta: meta(op, name, ""),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}

	probe := func(path string, period int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString("probes"), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds: period,
		}
	}
	podLabels := commonLabels(op)
	d.Deployment = &appsv1.Deployment{
		ObjectMeta: meta(op, name, ns),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			// Never fewer ready servers than asked for during a rollout:
			// the new pod is Ready before an old one starts to drain.
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					ServiceAccountName: name,
					// The server drains on SIGTERM, then finishes in-flight reviews.
					TerminationGracePeriodSeconds: ptr.To(ServerTerminationGracePeriodSeconds),
					// Pod Security Standards "restricted" (v1.37 profile).
					// fsGroup: the kubelet writes the serving-cert files
					// root-owned with mode 0440, so the non-root server
					// reads them only through their group (pkg/volume
					// SetVolumeOwnership; a real kubelet refused them
					// with "permission denied" without it).
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						// The serving Secret's files are root-owned, mode
						// 0440: the kubelet gives them this group and the
						// server process this supplementary group, whatever
						// uid the image runs as (a real kubelet refused the
						// server "permission denied" on tls.crt without it).
						FSGroup: ptr.To(serverFSGroup),
					},
					PriorityClassName:         op.Server.PriorityClassName,
					TopologySpreadConstraints: topologySpread(op.Server.TopologySpreadConstraints, selector),
					Containers: []corev1.Container{{
						Name:  "server",
						Image: image,
						Args:  args,
						Env: append([]corev1.EnvVar{{
							Name:      "POD_NAMESPACE",
							ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}},
						}}, s.ProxyEnv...),
						Ports: []corev1.ContainerPort{
							{Name: "webhook", ContainerPort: WebhookPort, Protocol: corev1.ProtocolTCP},
							{Name: "probes", ContainerPort: probePort, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP},
						},
						ReadinessProbe: probe("/readyz", 5),
						LivenessProbe:  probe("/healthz", 10),
						Resources:      res,
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot:             ptr.To(true),
							ReadOnlyRootFilesystem:   ptr.To(true),
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "serving-cert", MountPath: serverCertDir, ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{
						Name: "serving-cert",
						VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
							SecretName:  ServingSecretName(op),
							DefaultMode: ptr.To[int32](0o440),
						}},
					}},
				},
			},
		},
	}
	if replicas > 1 {
		d.PodDisruptionBudget = &policyv1.PodDisruptionBudget{
			ObjectMeta: meta(op, name, ns),
			Spec: policyv1.PodDisruptionBudgetSpec{
				MinAvailable: ptr.To(intstr.FromInt32(1)),
				Selector:     &metav1.LabelSelector{MatchLabels: selector},
			},
		}
	}
	d.Service = &corev1.Service{
		ObjectMeta: meta(op, name, ns),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: selector,
			Ports: []corev1.ServicePort{{
				Name: "https", Port: 443, TargetPort: intstr.FromInt32(WebhookPort), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
	d.Webhook = &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: meta(op, name, "")}
	return d
}

// topologySpread is the server pods' topologySpreadConstraints: user's
// (spec.server.topologySpreadConstraints) when set, each without a
// labelSelector given the Deployment's selector; else one over nodes
// (kubernetes.io/hostname) and one over zones (topology.kubernetes.io/zone),
// maxSkew 1 and ScheduleAnyway, so one zone's or one node's outage leaves a
// replica serving, and a one-node or one-zone cluster (or nodes without
// the zone label) still runs every replica.
func topologySpread(user []corev1.TopologySpreadConstraint, selector map[string]string) []corev1.TopologySpreadConstraint {
	if len(user) > 0 {
		out := make([]corev1.TopologySpreadConstraint, len(user))
		for i := range user {
			user[i].DeepCopyInto(&out[i])
			if out[i].LabelSelector == nil {
				out[i].LabelSelector = &metav1.LabelSelector{MatchLabels: maps.Clone(selector)}
			}
		}
		return out
	}
	return []corev1.TopologySpreadConstraint{{
		MaxSkew:           1,
		TopologyKey:       corev1.LabelHostname,
		WhenUnsatisfiable: corev1.ScheduleAnyway,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: selector},
	}, {
		MaxSkew:           1,
		TopologyKey:       corev1.LabelTopologyZone,
		WhenUnsatisfiable: corev1.ScheduleAnyway,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: selector},
	}}
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func or32(v *int32, def int32) int32 {
	if v == nil {
		return def
	}
	return *v
}
