// Package podindex is the operator's one compact store of pods: a record
// per pod holding only what the operator's decisions read, each pod's
// fleet state for each SidecarInjector, and the sums per injector,
// namespace and node, kept as events arrive.
//
// What the operator held before (hookwright 0.1, read in the code):
//   - the fleet's own controller-runtime cache of every pod of the cluster,
//     finished ones included, trimmed by a transform (since removed) to a
//     corev1.Pod with its metadata (labels, our annotations, owner
//     references), the names,
//     images and full ResourceRequirements of every container, phase and
//     Ready (3.7–4.9 KB per pod in a cache; about 21.7 KiB of resident
//     memory per pod measured, issue #24), plus every namespace trimmed;
//   - every fleet reconcile (of every SidecarInjector, on every pod event)
//     listed that cache and classified every pod again;
//   - the NodeOversell pass listed every pod of the cluster uncached (one
//     full LIST per pass) and, for a ratio change, one LIST per node;
//   - per node it held nothing between passes.
//
// What it holds now, per pod (Pod, 80 bytes and its name): namespace
// and node (interned), name, UID (16 bytes) and resourceVersion (a number)
// when they have the API server's usual form (any other form in a side
// record, weakly keyed by the record), creation time, phase (one byte),
// Ready, deleting, and one handle to the pod's shape: what its metadata
// and spec give that the replicas of one template share, interned as one
// value. The shape holds priorityClassName, hostNetwork, the cpu and
// memory the pod requests on its node (usageratio.PodRequests), the cpu
// the static CPU manager would pin, and four interned encoded sets:
// labels, our own sidecar.hookwright.io/ annotations, containers (name,
// image, init/sidecar/regular) and the controller owner reference.
// Interning uses Go's unique package, the runtime's one intern table: the
// replicas of a ReplicaSet share one shape, shapes with equal sets share
// the sets, and a shape or set no pod uses any more is collected. Per pod
// and injector the index holds four bits (the state); per injector its
// counts in total and per namespace; per namespace its labels and pod
// count; per node the sums of its running pods' requests and the slots
// of those pods. Nothing holds a corev1.Pod after Compact: the fleet and
// the rollout read a transient View built per decision.
//
// The fleet still judges a pod with sidecar.Decide, the webhook's own
// function, through fleet.Classify on the View (an adapter: the View has
// every field Decide and Classify read), never a copy of its rules. A new
// pod, or one whose namespace, shape (labels, our annotations,
// containers, priority class, hostNetwork, owner, requests), deletion or
// phase changed, is classified for each injector (O(injectors)); any
// other event (a readiness or status change) keeps its states. A list (a
// leader's initial sync, a re-sync) classifies every pod once: pods
// sharing all of the above (the replicas of a template in one namespace)
// once together. An injector change re-classifies every pod once: pods
// sharing shape, deletion and phase in namespaces that injector treats
// alike (fleet.KeyOfNamespace, which sidecar.KeyOfNamespace states beside
// Decide) once together. In a re-sync a pod that did not change keeps its
// record (Record): no second copy, no classification.
//
// It is pure: no Kubernetes client, no operator, no webhook server but the
// sidecar engine (through internal/fleet) and the oversell engine's units
// (through internal/usageratio). The shell (controllers/podindex.go) feeds
// it from one reflector on pods and one on namespaces.
package podindex
