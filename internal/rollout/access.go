package rollout

import (
	"context"
	"fmt"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// permissionTTL is how long a namespace's SelfSubjectAccessReview answers
// are reused: a RoleBinding created for the rollout takes effect within it.
const permissionTTL = time.Minute

// rights are the rights a strategy needs in a namespace, in the order they
// are reported (config/rollout grants them, bound per namespace).
func rights(spec *v1alpha1.RolloutSpec) []authorizationv1.ResourceAttributes {
	ra := func(group, resource, sub, verb string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Group: group, Resource: resource, Subresource: sub, Verb: verb}
	}
	out := []authorizationv1.ResourceAttributes{ra("", "pods", "", "get"), ra("policy", "poddisruptionbudgets", "", "list")}
	if spec.Strategy == v1alpha1.RolloutInPlace {
		out = append(out, ra("", "pods", "", "patch"), ra("", "pods", "resize", "patch"))
	}
	if spec.Strategy == v1alpha1.RolloutRestart || spec.FallbackToRestart {
		out = append(out, ra("apps", "replicasets", "", "get"))
		for _, w := range workloads {
			out = append(out, ra("apps", w.resource, "", "patch"))
		}
	}
	return out
}

// permitted asks the API server (SelfSubjectAccessReview) whether the
// operator holds the rights spec needs in ns: "" when it does, else the
// first missing one. Answers are kept permissionTTL.
func (r *Roller) permitted(ctx context.Context, ns string, spec *v1alpha1.RolloutSpec) string {
	key := ns + "|" + string(spec.Strategy) + fmt.Sprint(spec.FallbackToRestart)
	if missing, ok := r.memo.permission(key, r.now(), permissionTTL); ok {
		return missing
	}
	missing := ""
	for _, a := range rights(spec) {
		if missing = r.missing(ctx, ns, a); missing != "" {
			break
		}
	}
	r.memo.setPermission(key, permission{at: r.now(), missing: missing})
	return missing
}

// missing asks for one right in ns: "" when held, else what to grant.
func (r *Roller) missing(ctx context.Context, ns string, a authorizationv1.ResourceAttributes) string {
	a.Namespace = ns
	rev := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
	if err := r.client.Create(ctx, rev); err != nil {
		return "cannot ask the API server (SelfSubjectAccessReview): " + apiMessage(err)
	}
	if rev.Status.Allowed {
		return ""
	}
	res := a.Resource
	if a.Subresource != "" {
		res += "/" + a.Subresource
	}
	if a.Group != "" {
		res += "." + a.Group
	}
	return fmt.Sprintf("%s %s in namespace %s (bind ClusterRole hookwright-rollout, config/rollout)", a.Verb, res, ns)
}
