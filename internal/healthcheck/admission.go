package healthcheck

import (
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Request is an API request as admission rules match it.
type Request struct {
	Group, Version, Resource, Subresource string
	Operation                             admissionregistrationv1.OperationType
}

var (
	// PodCreate is what the SidecarInjector's webhook intercepts.
	PodCreate = Request{Version: "v1", Resource: "pods", Operation: admissionregistrationv1.Create}
	// NodeStatusUpdate is a kubelet heartbeat writing node status (a
	// PATCH is admitted as UPDATE).
	NodeStatusUpdate = Request{Version: "v1", Resource: "nodes", Subresource: "status", Operation: admissionregistrationv1.Update}
)

// Matches tells whether any rule matches r, with the API server's
// wildcard semantics (k8s.io/apiserver admission/plugin/webhook/predicates/rules):
// "*" is every resource but no subresource, "*/*" everything,
// "pods/*" every subresource of pods, "*/status" every status subresource.
// Scope is not judged: pods and nodes are each in one scope.
func Matches(rules []admissionregistrationv1.RuleWithOperations, r Request) bool {
	for _, rule := range rules {
		if !anyOf(rule.APIGroups, r.Group) || !anyOf(rule.APIVersions, r.Version) {
			continue
		}
		opOK := false
		for _, op := range rule.Operations {
			if op == admissionregistrationv1.OperationAll || op == r.Operation {
				opOK = true
			}
		}
		if !opOK {
			continue
		}
		for _, res := range rule.Resources {
			if resourceMatches(res, r.Resource, r.Subresource) {
				return true
			}
		}
	}
	return false
}

func anyOf(list []string, v string) bool {
	for _, x := range list {
		if x == "*" || x == v {
			return true
		}
	}
	return false
}

func resourceMatches(pattern, res, sub string) bool {
	if pattern == "*/*" {
		return true
	}
	pRes, pSub, hasSub := strings.Cut(pattern, "/")
	if !hasSub {
		return sub == "" && (pRes == "*" || pRes == res)
	}
	return sub != "" && (pRes == "*" || pRes == res) && (pSub == "*" || pSub == sub)
}

// ours tells whether the operator owns a webhook configuration.
func ours(w *admissionregistrationv1.MutatingWebhookConfiguration) bool {
	return w.Labels[LabelManagedBy] == ManagedByValue
}

// allNamespaces tells whether sel lets every namespace through but a
// fixed list of names (the system, operator and server namespaces our
// injector always excludes): it has no matchLabels and only NotIn or
// DoesNotExist on kubernetes.io/metadata.name.
func allNamespaces(sel *metav1.LabelSelector) bool {
	if sel == nil {
		return true
	}
	if len(sel.MatchLabels) > 0 {
		return false
	}
	for _, e := range sel.MatchExpressions {
		if e.Key != corev1.LabelMetadataName || e.Operator != metav1.LabelSelectorOpNotIn {
			return false
		}
	}
	return true
}

func timeout(w admissionregistrationv1.MutatingWebhook) time.Duration {
	if w.TimeoutSeconds == nil {
		return 10 * time.Second // the API's default (admissionregistration/v1)
	}
	return time.Duration(*w.TimeoutSeconds) * time.Second
}

// admission checks the risk our webhooks put on admission: Fail over
// every namespace, and the time a node heartbeat may wait on them.
func (c *checker) admission(_ []CR) {
	if c.f.MutatingWebhooks.Err != nil {
		msg, hint := readError("list", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", c.f.MutatingWebhooks.Err)
		c.add(AreaAdmission, "risky-scope", "no webhook of ours fails closed on every namespace", Fail, msg, hint)
		c.add(AreaAdmission, "heartbeat-budget", "node heartbeats cannot time out on our webhooks", Fail, msg, hint)
		return
	}
	var risky []string
	var oursSum, othersSum time.Duration
	var oursOn, othersOn []string
	for i := range c.f.MutatingWebhooks.Value {
		cfg := &c.f.MutatingWebhooks.Value[i]
		for _, w := range cfg.Webhooks {
			if ours(cfg) && w.FailurePolicy != nil && *w.FailurePolicy == admissionregistrationv1.Fail && allNamespaces(w.NamespaceSelector) &&
				(w.ObjectSelector == nil || len(w.ObjectSelector.MatchLabels) == 0) {
				risky = append(risky, cfg.Name)
			}
			if Matches(w.Rules, NodeStatusUpdate) {
				d := timeout(w)
				if ours(cfg) {
					oursSum += d
					oursOn = append(oursOn, fmt.Sprintf("%s %s", cfg.Name, d))
				} else {
					othersSum += d
					othersOn = append(othersOn, fmt.Sprintf("%s %s", cfg.Name, d))
				}
			}
		}
	}
	desc := "no webhook of ours fails closed on every namespace"
	if len(risky) > 0 {
		c.add(AreaAdmission, "risky-scope", desc, Warn,
			fmt.Sprintf("failurePolicy Fail over every namespace but the excluded ones: %s", strings.Join(risky, ", ")),
			"while its server is down no pod can be created in any namespace: narrow spec.namespaceSelector, or set failurePolicy Ignore and watch PodsMissingSidecars")
	} else {
		c.add(AreaAdmission, "risky-scope", desc, OK, "", "")
	}

	desc = "node heartbeats cannot time out on our webhooks"
	budget := c.f.KubeletStatusTimeout
	msg := fmt.Sprintf("our webhooks on nodes/status: %s of the kubelet's %s", oursSum, budget)
	if len(oursOn) > 0 {
		msg += " (" + strings.Join(oursOn, ", ") + ")"
	}
	if len(othersOn) > 0 {
		msg += fmt.Sprintf("; other webhooks add %s (%s)", othersSum, strings.Join(othersOn, ", "))
	}
	switch {
	case oursSum >= budget:
		c.add(AreaAdmission, "heartbeat-budget", desc, Fail, msg,
			"lower the NodeOversells' spec.timeoutSeconds so their sum stays under the kubelet's timeout, or keep their nodeSelectors from overlapping (the sum is a node every one selects)")
	case oursSum+othersSum >= budget:
		c.add(AreaAdmission, "heartbeat-budget", desc, Warn, msg,
			"with the other webhooks on nodes/status a slow status write can exceed the kubelet's timeout: lower the timeouts")
	default:
		c.add(AreaAdmission, "heartbeat-budget", desc, OK, msg, "")
	}
}

// fleet checks the SidecarInjectors' last reported pods missing their
// sidecars or running an outdated revision, and operator/server skew.
func (c *checker) fleet(crs []CR) {
	for _, cr := range crs {
		if cr.Fleet == nil {
			continue
		}
		fl := cr.Fleet
		desc := fmt.Sprintf("SidecarInjector %s: no pod misses its sidecars", cr.Name)
		if fl.MissingPods > 0 {
			c.add(AreaFleet, "fleet-missing", desc, Warn, fmt.Sprintf("%d of %d matched pods", fl.MissingPods, fl.MatchedPods),
				"they were created while the injector was down or skipped: hookwright status --pods "+cr.Name+", then restart them or set spec.rollout")
		} else {
			c.add(AreaFleet, "fleet-missing", desc, OK, fmt.Sprintf("%d matched pods", fl.MatchedPods), "")
		}
		desc = fmt.Sprintf("SidecarInjector %s: no injected pod is outdated", cr.Name)
		if fl.OutdatedPods > 0 {
			c.add(AreaFleet, "fleet-outdated", desc, Warn, fmt.Sprintf("%d of %d injected pods", fl.OutdatedPods, fl.InjectedPods),
				"hookwright status --pods "+cr.Name+" lists them; spec.rollout brings them up to date")
		} else {
			c.add(AreaFleet, "fleet-outdated", desc, OK, "", "")
		}
	}
	c.skew(crs)
}

// skew compares the image tag of the operator with each server's.
func (c *checker) skew(crs []CR) {
	const desc = "the operator and its servers run the same version"
	op := c.f.Operator.Value
	if c.f.Operator.Err != nil || op == nil || len(crs) == 0 {
		return
	}
	opTag := imageTag(op.Spec.Template.Spec.Containers)
	var off []string
	for _, cr := range crs {
		d := cr.Server.Value
		if cr.Server.Err != nil || d == nil {
			continue
		}
		if tag := imageTag(d.Spec.Template.Spec.Containers); tag != opTag {
			off = append(off, fmt.Sprintf("%s %s runs %s", cr.Kind, cr.Name, tag))
		}
	}
	msg := "operator " + opTag
	if c.f.CLIVersion != "" {
		msg += ", this CLI " + c.f.CLIVersion
	}
	if len(off) > 0 {
		c.add(AreaOperator, "version-skew", desc, Warn, msg+"; "+strings.Join(off, ", "),
			"the operator rolls its servers to its own image unless spec.server.image pins one: remove the pin, or upgrade the operator")
		return
	}
	c.add(AreaOperator, "version-skew", desc, OK, msg, "")
}

// imageTag is the tag (or digest) of the first container's image.
func imageTag(cs []corev1.Container) string {
	if len(cs) == 0 {
		return "(none)"
	}
	img := cs[0].Image
	if i := strings.LastIndex(img, "@"); i >= 0 {
		return img[i+1:]
	}
	if i := strings.LastIndex(img, ":"); i > strings.LastIndex(img, "/") {
		return img[i+1:]
	}
	return "latest"
}
