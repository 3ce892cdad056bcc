package healthcheck

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// Areas of `check --pre`.
const (
	AreaFeatures = "kubernetes-features"
	AreaRBAC     = "installer-rbac"
	AreaOverlap  = "existing-webhooks"
	MinKubeMinor = "v1.29.0" // the CSV's minKubeVersion
)

// Feature is an API one of our features needs, and how we degrade without it.
type Feature struct {
	ID, Name string
	// Since is the first server version with it on by default.
	Since string
	// GroupVersions / Resource: when set, the feature is found in discovery
	// (any of the group versions serving Resource) instead of by version.
	GroupVersions []string
	Resource      string
	// Served says, for a feature found in discovery, since when and how
	// it is served.
	Served string
	// Without says what happens on an older server.
	Without string
}

// Features are the APIs our features need (KEPs in docs/cli.md).
var Features = []Feature{
	{ID: "match-conditions", Name: "admissionregistration matchConditions", Since: "v1.28.0",
		Without: "the manager's validating webhook carries a matchCondition, which the API server refuses before v1.28 (KEP-3716; beta on by default in v1.28, GA in v1.30): the install fails"},
	{ID: "native-sidecars", Name: "native sidecars (restartPolicy Always init containers)", Since: "v1.29.0",
		Without: "nativeSidecars Auto injects plain containers (KEP-753)"},
	{ID: "in-place-resize", Name: "in-place pod resize (pods/resize)", Since: "v1.33.0",
		GroupVersions: []string{"v1"}, Resource: "pods/resize", Served: "on by default since v1.33, GA in v1.35",
		Without: "rollouts with strategy InPlace restart pods whose sidecar resources changed (KEP-1287)"},
	{ID: "cluster-trust-bundle", Name: "ClusterTrustBundle", Since: "v1.33.0",
		GroupVersions: []string{"certificates.k8s.io/v1", "certificates.k8s.io/v1beta1", "certificates.k8s.io/v1alpha1"}, Resource: "clustertrustbundles",
		Served:  "certificates.k8s.io/v1beta1 since v1.33, off unless the API server's --runtime-config and feature gate turn it on",
		Without: "certificate mode CSR publishes its CA in caBundles only (KEP-3257; condition reason ClusterTrustBundleUnavailable)"},
	{ID: "watch-list", Name: "WatchList (streaming lists)", Since: "v1.34.0",
		Without: "the operator's informers fall back to paged LISTs: more API server memory at start (KEP-3157)"},
}

// InstallerAccess are the rights `make deploy` (config/default) needs:
// what --pre asks with SelfSubjectAccessReview, in the operator namespace
// where namespaced.
var InstallerAccess = []Access{
	{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "create", Resource: "namespaces"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"},
	{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"},
	{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"},
	{Verb: "create", Group: "apps", Resource: "deployments", Namespace: "-"},
	{Verb: "create", Resource: "services", Namespace: "-"},
	{Verb: "create", Resource: "serviceaccounts", Namespace: "-"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "roles", Namespace: "-"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Namespace: "-"},
	{Verb: "create", Group: "policy", Resource: "poddisruptionbudgets", Namespace: "-"},
}

// Pre is `hookwright check --pre`: the API server version and the APIs
// each feature needs, the installer's rights, and existing mutating
// webhooks that would see the same requests as ours. Unreachable: only
// that check.
func Pre(f Facts) []Result {
	f = withDefaults(f)
	c := &checker{f: f}
	if !c.apiReachable() {
		return c.rs
	}
	c.version()
	c.features()
	c.rbac()
	c.overlap()
	return c.rs
}

func (c *checker) version() {
	desc := "the API server is at least " + MinKubeMinor
	v, err := utilversion.ParseGeneric(c.f.ServerVersion.Value)
	if err != nil {
		c.add(AreaAPI, "kube-version", desc, Warn, fmt.Sprintf("cannot parse %q: %v", c.f.ServerVersion.Value, err),
			"a distribution's version string: check it against "+MinKubeMinor+" by hand")
		return
	}
	if v.LessThan(utilversion.MustParseGeneric(MinKubeMinor)) {
		c.add(AreaAPI, "kube-version", desc, Fail, c.f.ServerVersion.Value, "upgrade the cluster to "+MinKubeMinor+" or later")
		return
	}
	c.add(AreaAPI, "kube-version", desc, OK, c.f.ServerVersion.Value, "")
}

func (c *checker) features() {
	v, verr := utilversion.ParseGeneric(c.f.ServerVersion.Value)
	for _, ft := range Features {
		desc := ft.Name + " is available"
		if ft.Resource != "" {
			if err := c.f.Pre.Resources.Err; err != nil {
				msg, hint := readError("get", "/apis", "", err)
				c.add(AreaFeatures, ft.ID, desc, Warn, msg, hint)
				continue
			}
			found := ""
			for _, gv := range ft.GroupVersions {
				if slices.Contains(c.f.Pre.Resources.Value[gv], ft.Resource) {
					found = gv
					break
				}
			}
			if found == "" {
				c.add(AreaFeatures, ft.ID, desc, Warn, fmt.Sprintf("%s not served (%s)", ft.Resource, ft.Served), ft.Without)
			} else {
				c.add(AreaFeatures, ft.ID, desc, OK, "served by "+found, "")
			}
			continue
		}
		switch {
		case verr != nil:
			c.add(AreaFeatures, ft.ID, desc, Warn, "unknown server version", ft.Without)
		case v.LessThan(utilversion.MustParseGeneric(ft.Since)):
			st := Warn
			if ft.ID == "match-conditions" {
				st = Fail
			}
			c.add(AreaFeatures, ft.ID, desc, st, fmt.Sprintf("needs %s, the server is %s", ft.Since, c.f.ServerVersion.Value), ft.Without)
		default:
			c.add(AreaFeatures, ft.ID, desc, OK, "since "+ft.Since, "")
		}
	}
}

func (c *checker) rbac() {
	for _, a := range c.f.Pre.Access {
		res := a.Resource
		if a.Group != "" {
			res += "." + a.Group
		}
		where := ""
		if a.Namespace != "" {
			where = " in namespace " + a.Namespace
		}
		desc := fmt.Sprintf("can %s %s%s", a.Verb, res, where)
		switch {
		case a.Err != nil:
			msg, hint := readError("create", "selfsubjectaccessreviews.authorization.k8s.io", "", a.Err)
			c.add(AreaRBAC, "installer-rbac", desc, Fail, msg, hint)
		case !a.Allowed:
			msg := "denied"
			if a.Reason != "" {
				msg += ": " + a.Reason
			}
			c.add(AreaRBAC, "installer-rbac", desc, Fail, msg,
				"install as a cluster administrator, or have one grant it (kubectl auth can-i "+a.Verb+" "+res+")")
		default:
			c.add(AreaRBAC, "installer-rbac", desc, OK, "", "")
		}
	}
}

// overlap finds mutating webhooks not ours that see pod creates or node
// status updates: their patches and ours are ordered by name and
// reinvocation, so each can undo or repeat the other's.
func (c *checker) overlap() {
	const desc = "no other mutating webhook sees the requests ours do"
	if err := c.f.MutatingWebhooks.Err; err != nil {
		msg, hint := readError("list", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", err)
		c.add(AreaOverlap, "webhook-overlap", desc, Fail, msg, hint)
		return
	}
	var pods, nodes []string
	for i := range c.f.MutatingWebhooks.Value {
		cfg := &c.f.MutatingWebhooks.Value[i]
		if ours(cfg) {
			continue
		}
		for _, w := range cfg.Webhooks {
			name := cfg.Name + "/" + w.Name
			if w.ReinvocationPolicy != nil && *w.ReinvocationPolicy == admissionregistrationv1.IfNeededReinvocationPolicy {
				name += " (reinvoked)"
			}
			if Matches(w.Rules, PodCreate) {
				pods = append(pods, name)
			}
			if Matches(w.Rules, NodeStatusUpdate) {
				nodes = append(nodes, name)
			}
		}
	}
	if len(pods)+len(nodes) == 0 {
		c.add(AreaOverlap, "webhook-overlap", desc, OK, "", "")
		return
	}
	var parts []string
	if len(pods) > 0 {
		parts = append(parts, "pod CREATE: "+strings.Join(pods, ", "))
	}
	if len(nodes) > 0 {
		parts = append(parts, "nodes/status UPDATE: "+strings.Join(nodes, ", "))
	}
	c.add(AreaOverlap, "webhook-overlap", desc, Warn, strings.Join(parts, "; "),
		"another injector (Istio, Linkerd) on the same namespaces injects twice: keep their namespace selectors disjoint; a webhook on nodes/status adds to the heartbeat budget")
}
