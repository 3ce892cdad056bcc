package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// kubeletStatusAudit is the API server's audit policy in this package: the
// kubelets' nodes/status patches at Metadata level, which carries the
// admission annotations (one mutation.webhook.admission.k8s.io annotation
// per webhook called, a failed-open one per call that failed under
// Ignore), and nothing else.
const kubeletStatusAudit = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:nodes"]
  verbs: ["patch"]
  resources:
  - group: ""
    resources: ["nodes/status"]
- level: None
`

// createLoad creates pods with dryRun=All in a namespace a SidecarInjector
// selects: each create goes through the mutating webhook and nothing is
// stored. Each answer is counted: failed (an error), uninjected (admitted
// without the injector's status annotation) or injected.
type createLoad struct {
	counts outcomes
	start  time.Time
	stop   context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	failures []string // the first ones, with their time
	slowest  time.Duration
}

const (
	loadFailed     = "failed"
	loadUninjected = "uninjected"
	loadInjected   = "injected"
)

// startCreateLoad runs workers loops, each creating a pod and pausing
// pause after each answer, on a client of its own without a client-side
// rate limit.
func startCreateLoad(ctx context.Context, t *testing.T, ns string, workers int, pause time.Duration) *createLoad {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS = -1
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	l := &createLoad{start: time.Now()}
	lctx, stop := context.WithCancel(ctx)
	l.stop = stop
	var seq sync.Mutex
	n := 0
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			cluster.Every(lctx, pause, func(lctx context.Context) {
				seq.Lock()
				n++
				name := fmt.Sprintf("zd-%d", n)
				seq.Unlock()
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: ociimage.StandinName}}},
				}
				sent := time.Now()
				err := c.Create(lctx, p, client.DryRunAll)
				took := time.Since(sent)
				switch {
				case lctx.Err() != nil:
					return
				case err != nil:
					l.counts.add(loadFailed, err.Error())
					l.mu.Lock()
					if len(l.failures) < 20 {
						l.failures = append(l.failures, sent.UTC().Format("15:04:05.000")+" "+err.Error())
					}
					l.mu.Unlock()
				case p.Annotations["sidecar.hookwright.io/status"] != "":
					l.counts.add(loadInjected, "")
				default:
					l.counts.add(loadUninjected, "")
				}
				l.mu.Lock()
				l.slowest = max(l.slowest, took)
				l.mu.Unlock()
			})
		}()
	}
	t.Cleanup(l.end)
	return l
}

// end stops the load and waits for its workers (safe to call twice).
func (l *createLoad) end() {
	l.stop()
	l.wg.Wait()
}

// waitMore waits until n more answers than now were counted.
func (l *createLoad) waitMore(ctx context.Context, t *testing.T, what string, n int) {
	t.Helper()
	n0 := l.counts.total()
	if err := cluster.WaitFor(ctx, 2*time.Minute, fmt.Sprintf("%d more pod creates %s", n, what), func(context.Context) (bool, error) {
		return l.counts.total()-n0 >= n, nil
	}); err != nil {
		c, _ := l.counts.get()
		t.Fatalf("%v (so far: %s)", err, fmtCounts(c))
	}
}

// serverRolledOut waits until the server Deployment of a CR has rolled out
// its generation gen: want replicas updated and available, and no server
// pod left but those and the terminating old ones. An old pod keeps
// answering the API server's pooled connections until the API server
// closes them (up to 90 s after its drain, --drain-close-wait), so the
// next disruption may begin while it still drains, as it would in a
// cluster.
func serverRolledOut(ctx context.Context, t *testing.T, kind desired.Kind, cr string, gen int64, want int32) {
	t.Helper()
	key := client.ObjectKey{Namespace: operatorNS, Name: kind.BaseName(cr)}
	var last string
	if err := cluster.WaitFor(ctx, 4*time.Minute, fmt.Sprintf("Deployment %s generation %d rolled out", key, gen), func(ctx context.Context) (bool, error) {
		dep := &appsv1.Deployment{}
		if err := env.Client.Get(ctx, key, dep); err != nil {
			return false, err
		}
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(operatorNS), client.MatchingLabels{desired.LabelInstance: key.Name}); err != nil {
			return false, err
		}
		s := dep.Status
		live := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
		last = fmt.Sprintf("observed generation %d, replicas %d, updated %d, available %d, pods %d not terminating", s.ObservedGeneration, s.Replicas, s.UpdatedReplicas, s.AvailableReplicas, len(live))
		return s.ObservedGeneration >= gen && s.Replicas == want && s.UpdatedReplicas == want && s.AvailableReplicas == want &&
			len(live) == int(want), nil
	}); err != nil {
		t.Fatalf("%v (last: %s)", err, last)
	}
}

// Zero dropped admissions while the injector's servers restart (issue
// 25): a SidecarInjector with failurePolicy Fail and 2 replicas under a
// load of dry-run pod creates, through a `kubectl rollout restart` of its
// server Deployment (the restartedAt template annotation), a server image
// change (the same program under a new tag and digest) and the deletion of
// one server pod. Every create is answered and injected: none fails, none
// is admitted without its sidecar. What makes it hold: maxUnavailable 0
// (a new pod is Ready before an old one goes), and the listener's drain on
// SIGTERM (readiness fails, answers close their connection for the drain
// period, then in-flight reviews finish), so the API server's pooled
// connections move to a ready replica instead of meeting a closed socket.
// The API server reaches the servers through their ClusterIP, dialled in
// the node's namespace where kube-proxy picks the pod (test/cluster).
func TestInjectorZeroDropThroughServerRestarts(t *testing.T) {
	// Beside TestOversellServerFrozen, which mostly waits: the two add
	// the longer one's time to the package, not their sum.
	t.Parallel()
	ctx := cluster.TestContext(t, 5*time.Minute)
	startOperator(t)
	pushOperatorImage(ctx, t)
	const ns = "zerodrop-load"
	if _, err := env.CreateNamespace(ctx, ns, map[string]string{"zerodrop": "enabled"}); err != nil {
		t.Fatal(err)
	}
	// The same program under a new tag and digest: the operator image with
	// one more config label.
	cfg, err := operatorImage.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := *cfg.Config.DeepCopy()
	c.Labels = maps.Clone(c.Labels)
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	c.Labels["io.hookwright.test"] = "zerodrop"
	newImg, err := mutate.Config(operatorImage, c)
	if err != nil {
		t.Fatal(err)
	}
	newImage := serverImage + "-zerodrop"
	if err := ociimage.Push(ctx, registryAddr, ociimage.Named{Name: newImage, Image: newImg}); err != nil {
		t.Fatal(err)
	}

	si := standinInjector("zerodrop", "zerodrop")
	if err := env.Client.Create(ctx, si); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, si) })
	waitAvailable(ctx, t, desired.SidecarKind, si.Name, 2)
	// Fail takes effect once the probe has seen the server answer.
	setFailurePolicy(ctx, t, si, v1alpha1.FailurePolicyFail)
	depKey := client.ObjectKey{Namespace: operatorNS, Name: desired.SidecarKind.BaseName(si.Name)}

	// Two loops, each pausing 20 ms after an answer: about 30 to 60
	// creates a second, as the machine allows (a figure, below), so a
	// create is in flight at every moment of each disruption. Under
	// HOOKWRIGHT_SCALE=full (make soak) four loops, about 60 to 120 a
	// second, the rate issue 25 asks for.
	workers, settle := 2, 100
	if full {
		workers, settle = 4, 200
	}
	// The API server's own timing of each webhook call, the figure the
	// default timeoutSeconds rests on (docs/failsafe.md).
	calls0, err := env.WebhookLatency(ctx, desired.SidecarKind.WebhookName)
	if err != nil {
		t.Fatal(err)
	}
	load := startCreateLoad(ctx, t, ns, workers, 20*time.Millisecond)
	// Counted answers, not seconds, before the first disruption: the API
	// server holds connections to both replicas by then.
	load.waitMore(ctx, t, "before the disruptions", settle)

	// generation bumps the Deployment with patch and returns the new
	// generation.
	patchDeployment := func(patch []byte) int64 {
		t.Helper()
		d, err := env.Clientset.AppsV1().Deployments(depKey.Namespace).Patch(ctx, depKey.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-rollout"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Generation
	}
	for _, d := range []struct {
		name string
		act  func()
	}{{
		// What `kubectl rollout restart` sends.
		"rollout restart", func() {
			gen := patchDeployment(fmt.Appendf(nil, `{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339)))
			serverRolledOut(ctx, t, desired.SidecarKind, si.Name, gen, 2)
		},
	}, {
		"image change", func() {
			patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"server":{"image":%q}}}`, newImage))
			if err := env.Client.Patch(ctx, si, patch); err != nil {
				t.Fatal(err)
			}
			var gen int64
			if err := cluster.WaitFor(ctx, time.Minute, "the operator renders "+newImage, func(ctx context.Context) (bool, error) {
				dep := &appsv1.Deployment{}
				err := env.Client.Get(ctx, depKey, dep)
				gen = dep.Generation
				return err == nil && dep.Spec.Template.Spec.Containers[0].Image == newImage, err
			}); err != nil {
				t.Fatal(err)
			}
			serverRolledOut(ctx, t, desired.SidecarKind, si.Name, gen, 2)
		},
	}, {
		// The one behind the API server's connection.
		"pod deletion", func() {
			p := busiestServerPod(ctx, t, desired.SidecarKind, si.Name)
			deleted := time.Now()
			reviews := make(chan lastReviews, 1)
			go func() { reviews <- watchReviews(ctx, p.Status.PodIP, desired.SidecarKind, deleted) }()
			if err := env.Client.Delete(ctx, p); err != nil {
				t.Fatal(err)
			}
			r := <-reviews
			t.Logf("figure: drain: the deleted server pod answered %d reviews after its deletion, the last %s after it; its metrics went away %s after it",
				r.after, r.last.Round(10*time.Millisecond), r.gone.Round(10*time.Millisecond))
			if err := cluster.WaitFor(ctx, 3*time.Minute, "deleted pod "+p.Name+" gone", func(ctx context.Context) (bool, error) {
				err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{})
				return err != nil, client.IgnoreNotFound(err)
			}); err != nil {
				t.Fatal(err)
			}
			dep := &appsv1.Deployment{}
			if err := env.Client.Get(ctx, depKey, dep); err != nil {
				t.Fatal(err)
			}
			serverRolledOut(ctx, t, desired.SidecarKind, si.Name, dep.Generation, 2)
		},
	}} {
		n0, start := load.counts.total(), time.Now()
		d.act()
		took := time.Since(start)
		n := load.counts.total() - n0
		t.Logf("figure: %s of the injector's server (2 replicas, Fail): %s until 2 new pods were available and the old ones terminating; %d pod creates meanwhile, %.0f/s",
			d.name, took.Round(100*time.Millisecond), n, float64(n)/took.Seconds())
		// Answers with the new pods serving, before the next disruption.
		load.waitMore(ctx, t, "after the "+d.name, settle)
	}
	load.end()
	ran := time.Since(load.start)
	if calls1, err := env.WebhookLatency(ctx, desired.SidecarKind.WebhookName); err != nil {
		t.Error(err)
	} else {
		t.Logf("figure: the API server's calls of %s through the 3 disruptions (apiserver_admission_webhook_admission_duration_seconds): %s",
			desired.SidecarKind.WebhookName, calls1.Minus(calls0))
	}
	counts, samples := load.counts.get()
	total := counts[loadFailed] + counts[loadUninjected] + counts[loadInjected]
	load.mu.Lock()
	failures, slowest := load.failures, load.slowest
	load.mu.Unlock()
	t.Logf("figure: dry-run pod creates through the 3 disruptions: %d in %s, %.0f/s held; %s; slowest answer %s",
		total, ran.Round(100*time.Millisecond), float64(total)/ran.Seconds(), fmtCounts(counts), slowest.Round(time.Millisecond))
	for _, f := range failures {
		t.Logf("failed create at %s", f)
	}
	if counts[loadFailed] != 0 {
		for _, c := range env.Egress.Cut() {
			t.Logf("egress relay cut by its target: %s", c)
		}
		t.Errorf("%d pod creates failed: %s", counts[loadFailed], samples[loadFailed])
	}
	if counts[loadUninjected] != 0 {
		t.Errorf("%d pod creates admitted without their sidecar", counts[loadUninjected])
	}
	if rate := float64(total) / ran.Seconds(); full && rate < 50 {
		// Not a failure: a loaded machine answers slower. The issue asks
		// for at least 50 a second; say so when it was not reached.
		t.Logf("note: %.0f creates/s is below the 50/s the issue asks for (a loaded machine)", rate)
	}
}

// lastReviews is what watchReviews saw of a terminating server pod.
type lastReviews struct {
	// after is the count of reviews answered after the start; last when
	// the count last grew and gone when the metrics stopped answering,
	// from the start.
	after      int
	last, gone time.Duration
}

// watchReviews reads a server pod's review counter every 20 ms from start
// until its metrics endpoint stops answering (the process exited): how
// long the API server kept sending it calls after its deletion, the drain
// the pod needed.
func watchReviews(ctx context.Context, podIP string, kind desired.Kind, start time.Time) lastReviews {
	hc := &http.Client{Timeout: time.Second}
	url := "http://" + net.JoinHostPort(podIP, strconv.Itoa(desired.MetricsPort)) + "/metrics"
	read := func() (float64, bool) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, false
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			return 0, false
		}
		n, err := sumMetric(string(b), reviewMetric(kind))
		return n, err == nil
	}
	var r lastReviews
	first, ok := read()
	if !ok {
		return r
	}
	prev := first
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	cluster.Every(wctx, 20*time.Millisecond, func(context.Context) {
		n, ok := read()
		if !ok {
			r.gone = time.Since(start)
			stop()
			return
		}
		if n > prev {
			r.last, prev = time.Since(start), n
		}
	})
	r.after = int(prev - first)
	return r
}

// kubeletPatch is one kubelet nodes/status patch as the audit log shows it.
type kubeletPatch struct {
	received, completed time.Time
	code                int32
	message             string
	// webhooks are the mutating webhooks called (configuration/webhook);
	// failedOpen those whose call failed and was ignored.
	webhooks, failedOpen []string
}

// kubeletPatches reads the audit log: the node's own status patches
// received in [from, to].
func kubeletPatches(t *testing.T, from, to time.Time) []kubeletPatch {
	t.Helper()
	f, err := os.Open(env.AuditLogPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []kubeletPatch
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("audit log line: %v", err)
		}
		if ev.Stage != auditv1.StageResponseComplete || ev.User.Username != "system:node:"+nodeName || ev.Verb != "patch" ||
			ev.ObjectRef == nil || ev.ObjectRef.Resource != "nodes" || ev.ObjectRef.Subresource != "status" {
			continue
		}
		if ev.RequestReceivedTimestamp.Time.Before(from) || ev.RequestReceivedTimestamp.Time.After(to) {
			continue
		}
		p := kubeletPatch{received: ev.RequestReceivedTimestamp.Time, completed: ev.StageTimestamp.Time}
		if ev.ResponseStatus != nil {
			p.code, p.message = ev.ResponseStatus.Code, ev.ResponseStatus.Message
		}
		for k, v := range ev.Annotations {
			switch {
			case strings.HasPrefix(k, "mutation.webhook.admission.k8s.io/"):
				var m struct{ Configuration, Webhook string }
				if err := json.Unmarshal([]byte(v), &m); err != nil {
					t.Fatalf("audit annotation %s=%s: %v", k, v, err)
				}
				p.webhooks = append(p.webhooks, m.Configuration+"/"+m.Webhook)
			case strings.HasPrefix(k, "failed-open.mutation.webhook.admission.k8s.io/"):
				p.failedOpen = append(p.failedOpen, v)
			}
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// nodeReady is the node's Ready condition.
func nodeReady(ctx context.Context) (*corev1.NodeCondition, error) {
	n, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return &n.Status.Conditions[i], nil
		}
	}
	return nil, fmt.Errorf("node %s has no Ready condition", nodeName)
}

// One NodeOversell server replica frozen (SIGSTOP) for four of the
// kubelet's status patches and a Lease renewal (60 s under
// HOOKWRIGHT_SCALE=full), then resumed (SIGCONT), on the real node with its kubelet reporting: while
// the node is amplified the kubelet's computed allocatable differs from
// the stored one, so it patches nodes/status every status period
// (nodeStatusUpdateFrequency, 4 s in this package). No patch fails, each reaches exactly one
// webhook (the node carries the NodeOversell label, so only the held.
// webhook matches it), and the node stays Ready with fresh conditions:
// its Lease renewed during the freeze and its Ready heartbeat no older
// than the oversell server's hold allows (5 min, the kubelet's default
// nodeStatusReportFrequency; webhooks/oversell DefaultMaxHeartbeatAge). A
// call that reaches the frozen replica waits for the webhook's
// timeoutSeconds (2 s by default) and is ignored (failurePolicy Ignore):
// that patch is stored raw, and the operator amplifies the node again once
// the server is back. The patches are counted from the API server's audit
// log (kubeletStatusAudit), which has each one's latency, response code and
// the webhooks it called.
func TestOversellServerFrozen(t *testing.T) {
	t.Parallel()
	ctx := cluster.TestContext(t, 4*time.Minute)
	startOperator(t)
	pushOperatorImage(ctx, t)
	no := realNodeOversell("frozen", 2)
	if err := env.Client.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, no) })
	waitAvailable(ctx, t, desired.OversellKind, no.Name, 2)
	allocatableRawWhenAmplified(ctx, t)
	if err := cluster.WaitFor(ctx, time.Minute, "node labelled "+v1alpha1.OversellNodeLabel, func(ctx context.Context) (bool, error) {
		n, err := env.Clientset.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err == nil && n.Labels[v1alpha1.OversellNodeLabel] != "", err
	}); err != nil {
		t.Fatal(err)
	}

	// The replica the API server's pooled connection goes to, found with
	// status patches of the kubelet's identity four times a second (the
	// kubelet's own come every 4 s here), stopped before the freeze: the next
	// kubelet patch takes that connection.
	kubelet, err := kubernetes.NewForConfig(env.KubeletConfig(nodeName))
	if err != nil {
		t.Fatal(err)
	}
	report := fmt.Appendf(nil, `{"status":{"allocatable":{"cpu":%q}}}`, rawCPU(ctx, t))
	pctx, stopPatches := context.WithCancel(ctx)
	patching := make(chan struct{})
	go func() {
		defer close(patching)
		cluster.Every(pctx, 250*time.Millisecond, func(pctx context.Context) {
			_, _ = kubelet.CoreV1().Nodes().Patch(pctx, nodeName, types.StrategicMergePatchType, report, metav1.PatchOptions{}, "status")
		})
	}()
	victim := busiestServerPod(ctx, t, desired.OversellKind, no.Name)
	stopPatches()
	<-patching
	pid := taskPID(ctx, t, strings.TrimPrefix(victim.Status.ContainerStatuses[0].ContainerID, "containerd://"))
	frozen := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %d: %v", pid, err)
			}
		}
	}
	t.Cleanup(thaw)
	// The freeze is the failure injected; the node is checked throughout.
	var beats []string
	ready := func(ctx context.Context) error {
		c, err := nodeReady(ctx)
		if err != nil {
			return err
		}
		if c.Status != corev1.ConditionTrue {
			return fmt.Errorf("node %s Ready %s: %s", nodeName, c.Status, c.Message)
		}
		if b := c.LastHeartbeatTime.UTC().Format("15:04:05"); len(beats) == 0 || beats[len(beats)-1] != b {
			beats = append(beats, b)
		}
		return nil
	}
	// The freeze lasts freezePatches of the kubelet's status patches
	// answered (the audit log's count, about 4 s apart here) and a renewal
	// of its Lease: each patch either missed the frozen replica or waited
	// for it and was ignored. HOOKWRIGHT_SCALE=full (make soak) freezes
	// for 60 s whatever the count.
	const freezePatches = 4
	var readyErr error
	if full {
		readyErr = cluster.During(ctx, time.Minute, time.Second, ready)
	} else {
		_, readyErr = cluster.Poll(ctx, time.Second, 3*time.Minute, fmt.Sprintf("%d kubelet status patches answered and a Lease renewal during the freeze", freezePatches),
			func(ctx context.Context) (bool, error) {
				if err := ready(ctx); err != nil {
					return false, cluster.Permanent(err)
				}
				answered := 0
				for _, p := range kubeletPatches(t, frozen, time.Now()) {
					if p.code >= 200 && p.code < 300 {
						answered++
					}
				}
				lease, err := env.Clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, nodeName, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				return answered >= freezePatches && lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(frozen), nil
			})
	}
	freezeFor := time.Since(frozen)
	t.Logf("Ready heartbeats seen during the freeze (began %s): %v", frozen.UTC().Format("15:04:05"), beats)
	thaw()
	end := time.Now()
	if readyErr != nil {
		t.Error(readyErr)
	}
	// Fresh: Ready with a heartbeat no older than the hold allows, and the
	// Lease the node lifecycle controller reads renewed during the freeze.
	c, err := nodeReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const maxHeartbeatAge = 5 * time.Minute
	if c.Status != corev1.ConditionTrue || end.Sub(c.LastHeartbeatTime.Time) > maxHeartbeatAge {
		t.Errorf("after the freeze, Ready %s with its heartbeat at %s (older than %s at %s)", c.Status, c.LastHeartbeatTime.UTC(), maxHeartbeatAge, end.UTC())
	}
	lease, err := env.Clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(frozen) {
		t.Errorf("node Lease renewed at %v, not since the freeze began (%s)", lease.Spec.RenewTime, frozen.UTC())
	}
	// The server resumes (or, killed by its liveness probe meanwhile,
	// restarts): both replicas serve again.
	waitPod(ctx, t, operatorNS, victim.Name, "Ready again", cluster.PodReady)
	waitAvailable(ctx, t, desired.OversellKind, no.Name, 2)

	patches := kubeletPatches(t, frozen, end)
	var slowest, gap time.Duration
	failed, failedOpen := 0, 0
	prev := frozen
	for _, p := range patches {
		slowest = max(slowest, p.completed.Sub(p.received))
		if p.code >= 200 && p.code < 300 {
			gap = max(gap, p.completed.Sub(prev))
			prev = p.completed
		} else {
			failed++
			t.Errorf("kubelet status patch at %s answered %d after %s: %s", p.received.UTC().Format("15:04:05.000"), p.code, p.completed.Sub(p.received), p.message)
		}
		failedOpen += len(p.failedOpen)
		if len(p.webhooks) != 1 {
			t.Errorf("kubelet status patch at %s called %d webhooks, want 1: %v", p.received.UTC().Format("15:04:05.000"), len(p.webhooks), p.webhooks)
		}
	}
	t.Logf("figure: one of 2 NodeOversell replicas frozen %s: %d kubelet status patches (audit log), %d failed, %d called the frozen replica and were ignored after the 2 s timeout, slowest %s, longest time between two answered patches %s",
		freezeFor.Round(100*time.Millisecond), len(patches), failed, failedOpen, slowest.Round(time.Millisecond), gap.Round(time.Millisecond))
	if len(patches) == 0 {
		t.Errorf("the audit log shows no kubelet status patch during the %s freeze", freezeFor)
	}
}
