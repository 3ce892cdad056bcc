package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// writeKubeconfig requests a token for the pod's ServiceAccount bound to the
// pod (TokenRequest, as the kubelet's projected token volume does) and
// writes a kubeconfig using it; the token file is what client-go re-reads.
func (r *PodRunner) writeKubeconfig(ctx context.Context, pod *corev1.Pod, dir string) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := r.c.Clientset.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(r.opts.TokenExpiration / time.Second)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for service account %s/%s: %w", pod.Namespace, sa, err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile+".new", []byte(tr.Status.Token), 0o600); err != nil {
		return "", err
	}
	if err := os.Rename(tokenFile+".new", tokenFile); err != nil { // readers never see half a token
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = &clientcmdapi.Cluster{Server: r.c.Config.Host, CertificateAuthorityData: r.c.Config.CAData}
	kc.AuthInfos["pod"] = &clientcmdapi.AuthInfo{TokenFile: tokenFile}
	kc.Contexts["pod"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "pod", Namespace: pod.Namespace}
	kc.CurrentContext = "pod"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, nil
}

// prepareContainer resolves the container's environment and command line
// and applies the path and port translations.
func (r *PodRunner) prepareContainer(ctx context.Context, pod *corev1.Pod, ctr *corev1.Container, img RunnerImage, volDirs map[string]string, kubeconfig string) (*runContainer, error) {
	rc := &runContainer{
		name: ctr.Name, bin: img.Binary, ports: map[int32]int{}, portNames: map[string]int32{},
		readiness: ctr.ReadinessProbe, stop: make(chan struct{}), done: make(chan struct{}),
	}
	for _, p := range ctr.Ports {
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			continue
		}
		lp, err := r.localPort()
		if err != nil {
			return nil, err
		}
		rc.ports[p.ContainerPort] = lp
		if p.Name != "" {
			rc.portNames[p.Name] = p.ContainerPort
		}
	}
	// A probe may name a port by number without declaring it (the
	// manager's health port): it is a listen port of the container too.
	for _, pr := range []*corev1.Probe{ctr.ReadinessProbe, ctr.LivenessProbe, ctr.StartupProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Port.IntValue() == 0 {
			continue
		}
		cp := int32(pr.HTTPGet.Port.IntValue())
		if _, ok := rc.ports[cp]; ok {
			continue
		}
		lp, err := r.localPort()
		if err != nil {
			return nil, err
		}
		rc.ports[cp] = lp
	}
	// mountPath → local directory, longest first so nested mounts win.
	type mount struct{ from, to string }
	var mounts []mount
	for _, m := range ctr.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			return nil, fmt.Errorf("volumeMount %s: subPath is not supported", m.Name)
		}
		dir, ok := volDirs[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s: no such volume", m.Name)
		}
		mounts = append(mounts, mount{strings.TrimRight(m.MountPath, "/"), dir})
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].from) > len(mounts[j].from) })
	translate := func(s string) string {
		for _, m := range mounts {
			s = replacePath(s, m.from, m.to)
		}
		return replacePort(s, rc.ports)
	}

	env, err := r.resolveEnv(ctx, pod, ctr)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	for i := range env {
		env[i][1] = translate(env[i][1])
		vars[env[i][0]] = env[i][1]
	}
	var argv []string
	switch {
	case len(ctr.Command) == 0:
	case ctr.Command[0] == img.Entrypoint:
		argv = append(argv, ctr.Command[1:]...)
	default:
		return nil, fmt.Errorf("command %q: only the image's entrypoint %s can run locally", ctr.Command[0], img.Entrypoint)
	}
	argv = append(argv, ctr.Args...)
	for _, a := range argv {
		rc.args = append(rc.args, translate(Expand(a, vars)))
	}
	seen := map[string]bool{}
	for _, kv := range env {
		seen[kv[0]] = true
		rc.env = append(rc.env, kv[0]+"="+kv[1])
	}
	if kubeconfig != "" && !seen["KUBECONFIG"] {
		rc.env = append(rc.env, "KUBECONFIG="+kubeconfig)
	}
	return rc, nil
}

// localPort returns a free local port no other pod of this runner was
// given: ports are only bound when a process starts, so FreePort alone can
// hand the same port to two pods prepared one after the other.
func (r *PodRunner) localPort() (int, error) {
	for range 100 {
		p, err := FreePort()
		if err != nil {
			return 0, err
		}
		r.mu.Lock()
		taken := r.ports[p]
		if !taken {
			r.ports[p] = true
		}
		r.mu.Unlock()
		if !taken {
			return p, nil
		}
	}
	return 0, errors.New("no free local port")
}

// resolveEnv returns the container's environment in order (envFrom first,
// then env), as NAME/value pairs with $(VAR) expanded.
func (r *PodRunner) resolveEnv(ctx context.Context, pod *corev1.Pod, ctr *corev1.Container) ([][2]string, error) {
	var out [][2]string
	vars := map[string]string{}
	set := func(k, v string) {
		if _, ok := vars[k]; ok {
			for i := range out {
				if out[i][0] == k {
					out[i][1] = v
				}
			}
		} else {
			out = append(out, [2]string{k, v})
		}
		vars[k] = v
	}
	for _, ef := range ctr.EnvFrom {
		var data map[string]string
		switch {
		case ef.SecretRef != nil:
			s, err := r.c.Clientset.CoreV1().Secrets(pod.Namespace).Get(ctx, ef.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && ptr.Deref(ef.SecretRef.Optional, false) {
					continue
				}
				return nil, err
			}
			data = map[string]string{}
			for k, b := range s.Data {
				data[k] = string(b)
			}
		case ef.ConfigMapRef != nil:
			cm, err := r.c.Clientset.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ef.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && ptr.Deref(ef.ConfigMapRef.Optional, false) {
					continue
				}
				return nil, err
			}
			data = cm.Data
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			set(ef.Prefix+k, data[k])
		}
	}
	for _, e := range ctr.Env {
		if e.ValueFrom == nil {
			set(e.Name, Expand(e.Value, vars))
			continue
		}
		v, ok, err := r.envValueFrom(ctx, pod, e.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	return out, nil
}

func (r *PodRunner) envValueFrom(ctx context.Context, pod *corev1.Pod, src *corev1.EnvVarSource) (string, bool, error) {
	switch {
	case src.FieldRef != nil:
		v, err := podField(pod, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := r.c.Clientset.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil {
			if b, ok := s.Data[ref.Key]; ok {
				return string(b), true, nil
			}
			err = fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key)
		} else if !apierrors.IsNotFound(err) {
			return "", false, err
		}
		if ptr.Deref(ref.Optional, false) {
			return "", false, nil
		}
		return "", false, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := r.c.Clientset.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil {
			if v, ok := cm.Data[ref.Key]; ok {
				return v, true, nil
			}
			err = fmt.Errorf("configmap %s has no key %q", ref.Name, ref.Key)
		} else if !apierrors.IsNotFound(err) {
			return "", false, err
		}
		if ptr.Deref(ref.Optional, false) {
			return "", false, nil
		}
		return "", false, err
	}
	return "", false, errors.New("only fieldRef, secretKeyRef and configMapKeyRef are supported")
}

// podField is the downward API's fieldRef value
// (pkg/fieldpath.ExtractFieldPathAsString plus the kubelet's status fields).
func podField(pod *corev1.Pod, path string) (string, error) {
	if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok && strings.HasSuffix(k, "']") {
		return pod.Labels[strings.TrimSuffix(k, "']")], nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.annotations['"); ok && strings.HasSuffix(k, "']") {
		return pod.Annotations[strings.TrimSuffix(k, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

// Expand replaces $(VAR) by vars[VAR] as the kubelet expands command, args
// and env values (third_party/forked/golang/expansion): "$$" is a literal
// "$", and a reference to an unknown variable is kept as written.
func Expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if j := strings.IndexByte(s[i+2:], ')'); j >= 0 {
				name := s[i+2 : i+2+j]
				if v, ok := vars[name]; ok {
					b.WriteString(v)
				} else {
					b.WriteString(s[i : i+3+j])
				}
				i += 2 + j
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// replacePath replaces from by to where from appears as a path: followed by
// "/" or the end of s, or a character that cannot continue a path element
// (space, ",", ":", ";", "=", quote).
func replacePath(s, from, to string) string {
	if from == "" {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, from)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(from)
		if end == len(s) || strings.ContainsRune("/ ,:;='\"", rune(s[end])) {
			b.WriteString(s[:i])
			b.WriteString(to)
		} else {
			b.WriteString(s[:end])
		}
		s = s[end:]
	}
}

// replacePort replaces the trailing number of s (after the start, ":" or
// "=") by its local port when it is a containerPort.
func replacePort(s string, ports map[int32]int) string {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	if i == len(s) || (i > 0 && s[i-1] != ':' && s[i-1] != '=') {
		return s
	}
	n, err := strconv.ParseInt(s[i:], 10, 32)
	if err != nil {
		return s
	}
	if lp, ok := ports[int32(n)]; ok {
		return s[:i] + strconv.Itoa(lp)
	}
	return s
}

// supervise runs the container's process and restarts it when it exits
// (restartPolicy Always), with a back-off of 1 s doubling to 10 s.
func (r *PodRunner) supervise(ctx context.Context, rp *runPod, rc *runContainer) {
	defer close(rc.done)
	backoff := time.Second
	for {
		started := time.Now()
		cmd, waitc, err := rc.start(rp.dir)
		if err != nil {
			r.opts.Logf("pod runner: %s/%s container %s: %v", rp.ns, rp.name, rc.name, err)
		} else {
			rc.starts.Add(1)
			rc.pid.Store(int32(cmd.Process.Pid))
			select {
			case err = <-waitc:
				rc.pid.Store(0)
				rc.ready.Store(false)
				r.Kick()
				if rc.starts.Load() == 1 {
					r.opts.Logf("pod runner: %s/%s container %s exited (%v); log %s:\n%s", rp.ns, rp.name, rc.name, err, rc.log, tailFile(rc.log, 800))
				} else {
					r.opts.Logf("pod runner: %s/%s container %s exited again (%v, start %d)", rp.ns, rp.name, rc.name, err, rc.starts.Load())
				}
			case <-rc.stop:
				terminate(cmd, waitc, rc.grace)
				rc.pid.Store(0)
				return
			case <-ctx.Done():
				terminate(cmd, waitc, rc.grace)
				rc.pid.Store(0)
				return
			}
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		select {
		case <-time.After(backoff):
		case <-rc.stop:
			return
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (rc *runContainer) start(dir string) (*exec.Cmd, chan error, error) {
	f, err := os.OpenFile(rc.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(rc.bin, rc.args...)
	cmd.Env = rc.env // the pod's environment only, never the runner's
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, nil, err
	}
	waitc := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		f.Close()
		waitc <- err
	}()
	return cmd, waitc, nil
}

// terminate sends SIGTERM to the process group, SIGKILL after grace.
func terminate(cmd *exec.Cmd, waitc chan error, grace time.Duration) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-waitc:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-waitc
}

func (rc *runContainer) halt() {
	select {
	case <-rc.stop:
	default:
		close(rc.stop)
	}
	<-rc.done
	rc.ready.Store(false)
}

// probe runs the readinessProbe (httpGet only; none: ready once started)
// every 500 ms and kicks the runner when the result changes.
func (r *PodRunner) probe(ctx context.Context, rc *runContainer) {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet does not verify probe certificates
	}}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := rc.pid.Load() != 0
		if ok && rc.readiness != nil && rc.readiness.HTTPGet != nil {
			ok = rc.httpProbe(ctx, hc, rc.readiness.HTTPGet)
		}
		if rc.ready.Swap(ok) != ok {
			r.Kick()
		}
		select {
		case <-ctx.Done():
			return
		case <-rc.stop:
			rc.ready.Store(false)
			return
		case <-tick.C:
		}
	}
}

func (rc *runContainer) httpProbe(ctx context.Context, hc *http.Client, g *corev1.HTTPGetAction) bool {
	cp := int32(g.Port.IntValue())
	if cp == 0 {
		cp = rc.portNames[g.Port.String()]
	}
	lp, ok := rc.ports[cp]
	if !ok {
		return false
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, lp, g.Path), nil)
	if err != nil {
		return false
	}
	res, err := hc.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode >= 200 && res.StatusCode < 400
}
