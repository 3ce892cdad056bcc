package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// PodRunner stands in for the kubelet's container runtime on kwok nodes,
// which run no containers: for every pod bound to a node whose container
// image is listed in Images, it starts the image's local executable as a
// process, as the pod spec says (command, args, env, volumes), and stops it
// when the pod is deleted. It routes the cluster egress (EgressProxy) to
// those processes: podIP:containerPort to the pod's process, and a Service's
// ClusterIP:port to the process of one ready pod it selects (the first by
// name), so admission webhooks, the service proxy and pods/proxy reach them.
//
// It translates exactly these things, because a local process shares the
// host's file system, ports and network:
//
//   - Paths: each volumeMount's mountPath becomes a directory of the pod's
//     local directory (<Dir>/<namespace>_<pod>/volumes/<volume>), in the
//     command, args and env values where the mount path appears as a path
//     (followed by "/" or the end of a word).
//   - Ports: each containerPort (and a port a probe's httpGet names by
//     number) gets a free local port; a command, arg or env
//     value whose trailing number, after the start, ":" or "=", equals a
//     containerPort gets the local port instead (":8081" → ":41234",
//     "--webhook-port=9443" → "--webhook-port=41235").
//   - API access: instead of the projected service account token and
//     KUBERNETES_SERVICE_HOST/PORT, the process gets KUBECONFIG pointing at a
//     kubeconfig for the API server with a TokenRequest token of the pod's
//     ServiceAccount bound to the pod (so RBAC is real), unless the pod sets
//     automountServiceAccountToken: false.
//
// Everything else is taken as it is: env values, valueFrom (fieldRef of
// metadata.name/namespace/uid/labels/annotations, spec.nodeName,
// spec.serviceAccountName, status.podIP/hostIP; secretKeyRef,
// configMapKeyRef), envFrom, $(VAR) expansion. Secret and ConfigMap volumes
// are written the kubelet's way (a "..data" symlink swapped atomically, see
// WriteAtomicDir) and rewritten when the object changes; emptyDir is an empty
// directory. A process that exits is restarted with a back-off, as with
// restartPolicy Always. Readiness: a Service routes to a pod only once its
// containers' readinessProbe (httpGet, against the translated port) succeeds;
// kwok still marks the pod Ready on its own. Not done: liveness probes,
// securityContext (the process runs as the current user), resource limits,
// service link variables, subPath, other volume types (the pod is not run and
// the reason logged).
type PodRunner struct {
	c    *Cluster
	opts PodRunnerOptions

	pods     listersv1.PodLister
	services listersv1.ServiceLister
	secrets  listersv1.SecretLister
	cms      listersv1.ConfigMapLister

	kick   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[types.UID]*runPod
	routes  map[string]string // egress target -> local address, set by this runner
	failed  map[types.UID]string
	// kubelet nodes (see KubeletNode): pod IPs assigned, pods being stopped.
	kubelet  map[string]bool
	podIPs   map[types.UID]string
	nextIP   int
	stopping map[types.UID]bool
	ports    map[int]bool // local ports given to containers (never reused)
}

// RunnerImage is a container image the runner can run locally.
type RunnerImage struct {
	// Binary is the local executable standing in for the image.
	Binary string
	// Entrypoint is the image's ENTRYPOINT executable (e.g. "/hookwright").
	// A container without command runs Binary with the container's args; a
	// container whose command starts with Entrypoint runs Binary with the
	// rest of the command and the args. Other commands are not supported.
	Entrypoint string
}

// PodRunnerOptions configure a PodRunner.
type PodRunnerOptions struct {
	// Images maps a container image reference, exactly as in the pod spec,
	// to what runs it.
	Images map[string]RunnerImage
	// Dir holds a directory per pod (volumes, kubeconfig, token, logs).
	// Default: <cluster Dir>/pods.
	Dir string
	// TokenExpiration of the service account tokens. Default 24 h.
	TokenExpiration time.Duration
	// Logf receives a line per pod start, stop and failure; nil: the
	// cluster's Logf.
	Logf func(format string, args ...any)
}

// RunningPod describes a pod the runner runs.
type RunningPod struct {
	Namespace, Name string
	UID             types.UID
	Dir             string
	Containers      []RunningContainer
}

// RunningContainer describes a container's local process.
type RunningContainer struct {
	Name string
	// PID of the current process, 0 between restarts.
	PID int
	// Starts counts process starts (1 = never restarted).
	Starts int
	// Ready is the last readinessProbe result.
	Ready bool
	// Ports maps containerPort to the local port.
	Ports map[int32]int
	// Command is the executable and arguments after translation.
	Command []string
	// Env is the environment after translation (NAME=value).
	Env []string
	// Log is the file receiving stdout and stderr.
	Log string
}

type runPod struct {
	ns, name string
	uid      types.UID
	dir      string
	labels   map[string]string
	podIP    string
	volumes  []*runVolume
	ctrs     []*runContainer
	stopped  chan struct{} // closed by stopAll
	stopOnce sync.Once
}

type runVolume struct {
	name, kind, ns, source string // kind "secret" or "configMap"
	dir                    string
	optional               bool
	items                  []corev1.KeyToPath
	mode                   int32
	rv                     string // the source's resourceVersion last written; "-" when absent
	lastErr                string
}

type runContainer struct {
	name      string
	bin       string
	args      []string
	env       []string
	ports     map[int32]int
	portNames map[string]int32
	readiness *corev1.Probe
	log       string
	grace     time.Duration

	ready  atomic.Bool
	starts atomic.Int32
	pid    atomic.Int32
	stop   chan struct{}
	done   chan struct{}
}

// NewPodRunner returns a runner for c; call Start.
func (c *Cluster) NewPodRunner(opts PodRunnerOptions) *PodRunner {
	if opts.Dir == "" {
		opts.Dir = filepath.Join(c.Dir, "pods")
	}
	if opts.TokenExpiration == 0 {
		opts.TokenExpiration = 24 * time.Hour
	}
	if opts.Logf == nil {
		opts.Logf = c.opts.Logf
	}
	return &PodRunner{
		c: c, opts: opts, kick: make(chan struct{}, 1),
		running: map[types.UID]*runPod{}, routes: map[string]string{}, failed: map[types.UID]string{},
		kubelet: map[string]bool{}, podIPs: map[types.UID]string{}, stopping: map[types.UID]bool{}, ports: map[int]bool{},
	}
}

// Start watches pods, Services, Secrets and ConfigMaps and runs pods until
// Stop or ctx ends.
func (r *PodRunner) Start(ctx context.Context) error {
	if err := os.MkdirAll(r.opts.Dir, 0o755); err != nil {
		return err
	}
	ctx, r.cancel = context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(r.c.Clientset, 0)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.Kick() },
		UpdateFunc: func(any, any) { r.Kick() },
		DeleteFunc: func(any) { r.Kick() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		f.Core().V1().Pods().Informer(), f.Core().V1().Services().Informer(),
		f.Core().V1().Secrets().Informer(), f.Core().V1().ConfigMaps().Informer(),
	} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	r.pods = f.Core().V1().Pods().Lister()
	r.services = f.Core().V1().Services().Lister()
	r.secrets = f.Core().V1().Secrets().Lister()
	r.cms = f.Core().V1().ConfigMaps().Lister()
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("pod runner: %v informer did not sync", typ)
		}
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			r.sync(ctx)
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
			case <-tick.C:
			}
		}
	}()
	return nil
}

// Kick makes the runner look at the cluster again now.
func (r *PodRunner) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Stop ends every process (SIGTERM, then SIGKILL after the pod's grace
// period, at most 10 s) and removes the runner's routes.
func (r *PodRunner) Stop() {
	if r.cancel != nil {
		r.cancel()
	}
	r.wg.Wait()
	r.mu.Lock()
	pods := make([]*runPod, 0, len(r.running))
	for uid, p := range r.running {
		pods = append(pods, p)
		delete(r.running, uid)
	}
	for target := range r.routes {
		r.c.Egress.Unroute(target)
		delete(r.routes, target)
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() { defer wg.Done(); p.stopAll() }()
	}
	wg.Wait()
}

// Pods lists the running pods, sorted by namespace and name.
func (r *PodRunner) Pods() []RunningPod {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]RunningPod, 0, len(r.running))
	for _, p := range r.running {
		rp := RunningPod{Namespace: p.ns, Name: p.name, UID: p.uid, Dir: p.dir}
		for _, c := range p.ctrs {
			rp.Containers = append(rp.Containers, RunningContainer{
				Name: c.name, PID: int(c.pid.Load()), Starts: int(c.starts.Load()), Ready: c.ready.Load(),
				Ports: c.ports, Command: append([]string{c.bin}, c.args...), Env: c.env, Log: c.log,
			})
		}
		out = append(out, rp)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// Routes returns the egress routes the runner set (target → local address).
func (r *PodRunner) Routes() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.routes))
	for k, v := range r.routes {
		out[k] = v
	}
	return out
}

func (r *PodRunner) runnable(p *corev1.Pod) bool {
	if p.Spec.NodeName == "" || p.DeletionTimestamp != nil ||
		p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range p.Spec.Containers {
		if _, ok := r.opts.Images[c.Image]; ok {
			return true
		}
	}
	return false
}

func (r *PodRunner) sync(ctx context.Context) {
	pods, err := r.pods.List(labels.Everything())
	if err != nil {
		return
	}
	want := map[types.UID]*corev1.Pod{}
	for _, p := range pods {
		if r.runnable(p) {
			want[p.UID] = p
		}
	}
	r.mu.Lock()
	var gone []*runPod
	for uid, rp := range r.running {
		if _, ok := want[uid]; !ok {
			gone = append(gone, rp)
			delete(r.running, uid)
		}
	}
	for uid := range r.failed {
		if _, ok := want[uid]; !ok {
			delete(r.failed, uid)
		}
	}
	r.mu.Unlock()
	for _, rp := range gone {
		r.opts.Logf("pod runner: stopping %s/%s", rp.ns, rp.name)
		r.mu.Lock()
		r.stopping[rp.uid] = true
		r.mu.Unlock()
		go func() {
			rp.stopAll()
			r.mu.Lock()
			delete(r.stopping, rp.uid)
			r.mu.Unlock()
			r.Kick()
		}()
	}
	for uid, p := range want {
		r.mu.Lock()
		rp := r.running[uid]
		r.mu.Unlock()
		if rp == nil {
			rp, err = r.startPod(ctx, p)
			r.mu.Lock()
			if err != nil {
				if r.failed[uid] != err.Error() {
					r.opts.Logf("pod runner: cannot run %s/%s yet: %v", p.Namespace, p.Name, err)
				}
				r.failed[uid] = err.Error()
				r.mu.Unlock()
				continue
			}
			delete(r.failed, uid)
			r.running[uid] = rp
			r.mu.Unlock()
			continue
		}
		ip := p.Status.PodIP
		if r.isKubeletNode(p.Spec.NodeName) {
			ip = r.podIPFor(p.UID)
		}
		r.mu.Lock()
		rp.podIP = ip
		rp.labels = p.Labels
		r.mu.Unlock()
		for _, v := range rp.volumes {
			err := r.writeVolume(v)
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			if msg != v.lastErr && msg != "" {
				r.opts.Logf("pod runner: %s/%s volume %s: %v", rp.ns, rp.name, v.name, err)
			}
			v.lastErr = msg
		}
	}
	r.syncRoutes()
	r.kubeletSync(ctx, pods)
}

// syncRoutes points podIP:port and the Services' ClusterIP:port at the
// local processes, and removes the runner's routes that no longer apply.
func (r *PodRunner) syncRoutes() {
	svcs, err := r.services.List(labels.Everything())
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	desired := map[string]string{}
	byNS := map[string][]*runPod{}
	for _, p := range r.running {
		for _, c := range p.ctrs {
			for cp, lp := range c.ports {
				if p.podIP != "" {
					desired[fmt.Sprintf("%s:%d", p.podIP, cp)] = fmt.Sprintf("127.0.0.1:%d", lp)
				}
			}
		}
		byNS[p.ns] = append(byNS[p.ns], p)
	}
	for _, s := range svcs {
		if len(s.Spec.Selector) == 0 || s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		sel := labels.SelectorFromSet(s.Spec.Selector)
		var pick *runPod
		cands := byNS[s.Namespace]
		sort.Slice(cands, func(i, j int) bool { return cands[i].name < cands[j].name })
		for _, p := range cands {
			if sel.Matches(labels.Set(p.labels)) && p.ready() {
				pick = p
				break
			}
		}
		if pick == nil {
			continue
		}
		for _, sp := range s.Spec.Ports {
			if local, ok := pick.localPort(sp.TargetPort.IntValue(), sp.TargetPort.String(), sp.Port); ok {
				desired[fmt.Sprintf("%s:%d", s.Spec.ClusterIP, sp.Port)] = fmt.Sprintf("127.0.0.1:%d", local)
			}
		}
	}
	for target, local := range desired {
		if r.routes[target] != local {
			r.c.Egress.Route(target, local)
			r.routes[target] = local
		}
	}
	for target := range r.routes {
		if _, ok := desired[target]; !ok {
			r.c.Egress.Unroute(target)
			delete(r.routes, target)
		}
	}
}

func (p *runPod) ready() bool {
	for _, c := range p.ctrs {
		if !c.ready.Load() {
			return false
		}
	}
	return true
}

// localPort resolves a Service targetPort (number, or a port name; an
// empty targetPort means the Service port) to the local port.
func (p *runPod) localPort(num int, name string, svcPort int32) (int, bool) {
	for _, c := range p.ctrs {
		cp := int32(num)
		if num == 0 {
			if n, ok := c.portNames[name]; ok {
				cp = n
			} else if name == "" || name == "0" {
				cp = svcPort
			}
		}
		if lp, ok := c.ports[cp]; ok {
			return lp, true
		}
	}
	return 0, false
}

func (p *runPod) stopAll() {
	p.stopOnce.Do(func() { close(p.stopped) })
	var wg sync.WaitGroup
	for _, c := range p.ctrs {
		wg.Add(1)
		go func() { defer wg.Done(); c.halt() }()
	}
	wg.Wait()
}

func (r *PodRunner) startPod(ctx context.Context, pod *corev1.Pod) (*runPod, error) {
	rp := &runPod{
		ns: pod.Namespace, name: pod.Name, uid: pod.UID, labels: pod.Labels, podIP: pod.Status.PodIP,
		dir: filepath.Join(r.opts.Dir, pod.Namespace+"_"+pod.Name), stopped: make(chan struct{}),
	}
	if r.isKubeletNode(pod.Spec.NodeName) {
		rp.podIP = r.podIPFor(pod.UID)
	}
	if err := os.MkdirAll(filepath.Join(rp.dir, "volumes"), 0o755); err != nil {
		return nil, err
	}
	// Volumes first: like the kubelet, a missing required Secret keeps the
	// pod from starting (ContainerCreating) until it exists.
	mounts := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(rp.dir, "volumes", v.Name)
		mounts[v.Name] = dir
		switch {
		case v.Secret != nil:
			rv := &runVolume{name: v.Name, kind: "secret", ns: pod.Namespace, source: v.Secret.SecretName, dir: dir,
				optional: ptr.Deref(v.Secret.Optional, false), items: v.Secret.Items, mode: ptr.Deref(v.Secret.DefaultMode, 0o644)}
			rp.volumes = append(rp.volumes, rv)
		case v.ConfigMap != nil:
			rv := &runVolume{name: v.Name, kind: "configMap", ns: pod.Namespace, source: v.ConfigMap.Name, dir: dir,
				optional: ptr.Deref(v.ConfigMap.Optional, false), items: v.ConfigMap.Items, mode: ptr.Deref(v.ConfigMap.DefaultMode, 0o644)}
			rp.volumes = append(rp.volumes, rv)
		case v.EmptyDir != nil:
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("volume %s: only secret, configMap and emptyDir volumes are supported", v.Name)
		}
	}
	for _, v := range rp.volumes {
		if err := r.writeVolume(v); err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.name, err)
		}
	}
	var kubeconfig string
	if ptr.Deref(pod.Spec.AutomountServiceAccountToken, true) {
		var err error
		if kubeconfig, err = r.writeKubeconfig(ctx, pod, rp.dir); err != nil {
			return nil, err
		}
	}
	grace := 10 * time.Second
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
		grace = time.Duration(*g) * time.Second
	}
	for i := range pod.Spec.Containers {
		ctr := &pod.Spec.Containers[i]
		img, ok := r.opts.Images[ctr.Image]
		if !ok {
			continue // another image: kwok pretends it runs
		}
		rc, err := r.prepareContainer(ctx, pod, ctr, img, mounts, kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", ctr.Name, err)
		}
		rc.log = filepath.Join(rp.dir, ctr.Name+".log")
		rc.grace = grace
		rp.ctrs = append(rp.ctrs, rc)
	}
	r.opts.Logf("pod runner: starting %s/%s on %s", pod.Namespace, pod.Name, pod.Spec.NodeName)
	if kubeconfig != "" {
		// Renew the token at 80 % of its life, as the kubelet does for a
		// projected token; client-go re-reads the token file.
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-rp.stopped:
					return
				case <-time.After(r.opts.TokenExpiration * 4 / 5):
				}
				if _, err := r.writeKubeconfig(ctx, pod, rp.dir); err != nil {
					r.opts.Logf("pod runner: %s/%s: renew token: %v", pod.Namespace, pod.Name, err)
				}
			}
		}()
	}
	for _, rc := range rp.ctrs {
		r.wg.Add(2)
		go func() { defer r.wg.Done(); r.supervise(ctx, rp, rc) }()
		go func() { defer r.wg.Done(); r.probe(ctx, rc) }()
	}
	return rp, nil
}

// writeVolume writes a Secret or ConfigMap volume when its source changed
// since the last write (or is written for the first time).
func (r *PodRunner) writeVolume(v *runVolume) error {
	var (
		data map[string][]byte
		rv   string
		err  error
	)
	switch v.kind {
	case "secret":
		var s *corev1.Secret
		if s, err = r.secrets.Secrets(v.ns).Get(v.source); err == nil {
			data, rv = s.Data, s.ResourceVersion
		}
	case "configMap":
		var cm *corev1.ConfigMap
		if cm, err = r.cms.ConfigMaps(v.ns).Get(v.source); err == nil {
			data, rv = map[string][]byte{}, cm.ResourceVersion
			for k, s := range cm.Data {
				data[k] = []byte(s)
			}
			for k, b := range cm.BinaryData {
				data[k] = b
			}
		}
	}
	if apierrors.IsNotFound(err) {
		if !v.optional {
			return fmt.Errorf("%s %s/%s not found", v.kind, v.ns, v.source)
		}
		data, rv, err = nil, "-", nil
	}
	if err != nil {
		return err
	}
	if rv == v.rv {
		return nil
	}
	payload := map[string][]byte{}
	if len(v.items) == 0 {
		for k, b := range data {
			payload[k] = b
		}
	} else {
		for _, it := range v.items {
			b, ok := data[it.Key]
			if !ok {
				if v.optional {
					continue
				}
				return fmt.Errorf("%s %s/%s has no key %q", v.kind, v.ns, v.source, it.Key)
			}
			payload[it.Path] = b
		}
	}
	if err := WriteAtomicDir(v.dir, payload, os.FileMode(v.mode)&0o777); err != nil {
		return err
	}
	v.rv = rv
	return nil
}
