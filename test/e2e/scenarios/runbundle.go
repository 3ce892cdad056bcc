package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

// The names scenario 7 and the README's block install.
const (
	csv010 = "hookwright.v0.1.0"
	csv011 = "hookwright.v0.1.1"
	// image011 is the operator image the 0.1.1 bundle names (make
	// bundle-image VERSION=0.1.1 builds it as IMG).
	image011 = "ghcr.io/hookwright/hookwright:v0.1.1"
)

// RunBundle is scenario 7: the README's "OLM without Docker" block
// (READMEBlock) run as written against this stack (Shell: DEMO_DIR is its
// directory, so the targets take the kubeconfig, the registry's HTTPS
// address and its CA from its env file), all but its last line:
//
//   - make cleanup-bundle removes scenario 5's catalog install: operator-sdk
//     cleanup deletes its Subscription, CSV, CatalogSource and
//     OperatorGroup and the CRDs, so every SidecarInjector and NodeOversell
//     (each NodeOversell restores its nodes while the operator still runs);
//   - make bundle-image, make run-bundle: the CSV hookwright.v0.1.0
//     Succeeded, its operator pods Running and Ready in containerd on
//     SystemNode; config/samples applied and Ready;
//   - make bundle-image VERSION=0.1.1, make run-bundle-upgrade
//     VERSION=0.1.1: the CSV hookwright.v0.1.1 Succeeded, its pods running
//     image011, the CRs' UIDs unchanged, pods injected; through it, a
//     second SidecarInjector beside the sample and 50 dry-run pod creates
//     a second into both: every one admitted and injected, and the server
//     Deployments rolled to image011 one at a time (upgradeLoad).
//
// It leaves that install running with the samples applied, for the
// scenarios after it. The block's last line, make cleanup-bundle, is
// READMEOLM's: test/e2e runs it after every scenario, so the block runs
// once in all, as a user with a running make demo would run it.
func RunBundle(ctx context.Context, e *Env, r *Result) error {
	lines, err := READMEBlock()
	if err != nil {
		return err
	}
	if len(lines) < 2 || lines[0] != cleanupLine || lines[len(lines)-1] != cleanupLine {
		return fmt.Errorf("README block %q: want %s first and last", lines, cleanupLine)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	var sis v1alpha1.SidecarInjectorList
	var nos v1alpha1.NodeOversellList
	if err := c.List(ctx, &sis); err != nil {
		return err
	}
	if err := c.List(ctx, &nos); err != nil {
		return err
	}
	b := &readmeRun{crsBefore: fmt.Sprintf("SidecarInjectors: %d, NodeOversells: %d", len(sis.Items), len(nos.Items))}
	for _, line := range lines[:len(lines)-1] {
		if err := e.readmeLine(ctx, r, b, line); err != nil {
			return err
		}
	}
	if b.upgraded == nil {
		return fmt.Errorf("README block %q: no make run-bundle-upgrade VERSION=0.1.1", lines)
	}
	if err := e.WaitReady(ctx, 3*time.Minute); err != nil {
		return err
	}
	lag, err := injectionWorks(ctx, e, "rb-1")
	if err != nil {
		return err
	}
	r.check("after the upgrade the CRs are Ready and a pod is injected %s later", lag.Round(time.Millisecond))
	r.timing("the make commands above, added up", b.total, 0)
	e.readme = b
	return nil
}

// cleanupLine is the README block's first and last command; upgradeLine
// upgrades the install make run-bundle made (under load: upgradeLoad).
const (
	cleanupLine = "make cleanup-bundle"
	upgradeLine = "make run-bundle-upgrade VERSION=0.1.1"
)

// readmeRun is what the README block's lines leave for the lines after
// them (scenario 7 runs all but the last; READMEOLM the last).
type readmeRun struct {
	// crsBefore counts the CRs the first cleanup removes.
	crsBefore string
	// before is installScope after the first cleanup.
	before map[olm.ObjectKey]olm.ObjectInfo
	// crs are the samples' UIDs as make run-bundle left them.
	crs map[string]types.UID
	// upgraded is the 0.1.1 operator's pods after the upgrade.
	upgraded []string
	cleanups int
	total    time.Duration
}

// readmeLine runs one line of the README block and checks what it
// promises.
func (e *Env) readmeLine(ctx context.Context, r *Result, b *readmeRun, line string) error {
	// An install or an upgrade through OLM within 2 minutes: what the
	// issue asks of the block's commands one by one.
	var bound time.Duration
	if strings.HasPrefix(line, "make run-bundle") {
		bound = 2 * time.Minute
	}
	var load *upgradeLoad
	if line == upgradeLine {
		var err error
		if load, err = e.beginUpgradeLoad(ctx, r, image011); err != nil {
			return err
		}
		defer load.stop()
	}
	took, err := e.Shell(ctx, line)
	b.total += took
	r.timing(line, took, bound)
	if err != nil {
		return err
	}
	switch line {
	case cleanupLine:
		b.cleanups++
		if err := e.crdsGone(ctx); err != nil {
			return err
		}
		if b.cleanups > 1 {
			left, err := e.leftAfter(ctx, b.before)
			if err != nil {
				return err
			}
			r.check("%s: nothing of the install left among %d objects of every listable kind (OLM's Operator object included), Events aside", line, len(left))
			return nil
		}
		if e.olmInstall != nil {
			e.olmInstall.StopCatalog()
			e.olmInstall = nil
		}
		if b.before, err = e.installScope(ctx); err != nil {
			return err
		}
		r.check("%s removed the install before it (scenario 5's catalog install: operator-sdk cleanup deletes Subscription, CSV, CatalogSource, OperatorGroup) and the CRDs, and with them every CR (%s), as it says; %d objects listed (cluster-scoped, %s, %s)",
			line, b.crsBefore, len(b.before), OperatorNamespace, olm.DefaultNamespace)
	case "make run-bundle":
		pods, err := e.checkCSV(ctx, csv010, ServerImage)
		if err != nil {
			return err
		}
		start := time.Now()
		if b.crs, err = e.applySamples(ctx); err != nil {
			return err
		}
		r.timing("config/samples applied → Ready (their servers' pods Ready)", time.Since(start), 0)
		r.check("%s: CSV %s Succeeded, operator pods %s Running and Ready in containerd on %s; config/samples applied and Ready", line, csv010, strings.Join(pods, ", "), SystemNode)
	case upgradeLine:
		pods, err := e.checkCSV(ctx, csv011, image011)
		if err != nil {
			return err
		}
		if err := e.sameUIDs(ctx, b.crs); err != nil {
			return err
		}
		b.upgraded = pods
		r.check("%s: CSV %s Succeeded (replaces %s, which is gone); operator pods %s run %s; the CRs kept their UIDs", line, csv011, csv010, strings.Join(pods, ", "), image011)
		return e.finishUpgradeLoad(ctx, r, load)
	}
	return nil
}

// client returns a client with OLM's and apiextensions' kinds registered
// besides the harness's (made once).
func (e *Env) client() (client.Client, error) {
	e.clientOnce.Do(func() {
		scheme := runtime.NewScheme()
		for _, add := range []func(*runtime.Scheme) error{
			clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, operatorsv1alpha1.AddToScheme,
			operatorsv1.AddToScheme, v1alpha1.AddToScheme,
		} {
			if e.clientErr = add(scheme); e.clientErr != nil {
				return
			}
		}
		e.allKinds, e.clientErr = client.New(e.Cluster.Config, client.Options{Scheme: scheme})
	})
	return e.allKinds, e.clientErr
}

// crdsGone waits until hookwright's CRDs are deleted.
func (e *Env) crdsGone(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	return cluster.WaitFor(ctx, 2*time.Minute, "hookwright's CRDs deleted", func(ctx context.Context) (bool, error) {
		for _, n := range []string{"sidecarinjectors.admission.hookwright.io", "nodeoversells.admission.hookwright.io"} {
			err := c.Get(ctx, client.ObjectKey{Name: n}, &apiextensionsv1.CustomResourceDefinition{})
			if err == nil || !apierrors.IsNotFound(err) {
				return false, client.IgnoreNotFound(err)
			}
		}
		return true, nil
	})
}

// checkCSV checks the CSV name is Succeeded and its operator Deployment
// rolled out with every pod Running and Ready in containerd on SystemNode,
// running image; it returns the pods' names.
func (e *Env) checkCSV(ctx context.Context, name, image string) ([]string, error) {
	c, err := e.client()
	if err != nil {
		return nil, err
	}
	csv := &operatorsv1alpha1.ClusterServiceVersion{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: name}, csv); err != nil {
		return nil, err
	}
	if csv.Status.Phase != operatorsv1alpha1.CSVPhaseSucceeded {
		return nil, fmt.Errorf("csv %s phase %s: %s", name, csv.Status.Phase, csv.Status.Message)
	}
	var names []string
	var why string
	err = cluster.WaitFor(ctx, 3*time.Minute, "the operator Deployment of "+name+" rolled out on "+SystemNode, func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: OperatorDeployment}, d); err != nil {
			return false, err
		}
		if d.Labels["olm.owner"] != name {
			why = fmt.Sprintf("deployment owned by %q", d.Labels["olm.owner"])
			return false, nil
		}
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "manager"}); err != nil {
			return false, err
		}
		want := 1
		if d.Spec.Replicas != nil {
			want = int(*d.Spec.Replicas)
		}
		names = nil
		for _, p := range pods.Items {
			ok := p.DeletionTimestamp == nil && p.Spec.NodeName == SystemNode && p.Status.Phase == corev1.PodRunning && cluster.PodReady(&p) &&
				len(p.Spec.Containers) == 1 && p.Spec.Containers[0].Image == image &&
				len(p.Status.ContainerStatuses) == 1 && strings.HasPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
			if !ok {
				why = fmt.Sprintf("pod %s: node %q phase %s ready %v image %v", p.Name, p.Spec.NodeName, p.Status.Phase, cluster.PodReady(&p), p.Spec.Containers[0].Image)
				return false, nil
			}
			names = append(names, p.Name)
		}
		return len(names) == want && d.Status.UpdatedReplicas == int32(want) && d.Status.AvailableReplicas == int32(want), nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, why)
	}
	return names, nil
}

// applySamples creates config/samples (as committed) through the
// operator's validating webhook, waits until both are Ready and returns
// their UIDs by name.
func (e *Env) applySamples(ctx context.Context) (map[string]types.UID, error) {
	si := &v1alpha1.SidecarInjector{}
	if err := cluster.LoadSample(injectorSample, si); err != nil {
		return nil, err
	}
	no := &v1alpha1.NodeOversell{}
	if err := cluster.LoadSample(oversellSample, no); err != nil {
		return nil, err
	}
	uids := map[string]types.UID{}
	for _, obj := range []client.Object{si, no} {
		if err := createValidated(ctx, e.Cluster, obj); err != nil {
			return nil, fmt.Errorf("apply sample %s: %w", obj.GetName(), err)
		}
		uids[fmt.Sprintf("%T/%s", obj, obj.GetName())] = obj.GetUID()
	}
	return uids, e.WaitReady(ctx, 3*time.Minute)
}

// sameUIDs checks the samples still exist with the UIDs applySamples gave.
func (e *Env) sameUIDs(ctx context.Context, uids map[string]types.UID) error {
	si := &v1alpha1.SidecarInjector{}
	no := &v1alpha1.NodeOversell{}
	for _, x := range []struct {
		obj  client.Object
		name string
	}{{si, SampleInjectorName}, {no, SampleOversellName}} {
		if err := e.Cluster.Client.Get(ctx, client.ObjectKey{Name: x.name}, x.obj); err != nil {
			return err
		}
		key := fmt.Sprintf("%T/%s", x.obj, x.name)
		if x.obj.GetUID() != uids[key] {
			return fmt.Errorf("%s has uid %s, was %s: recreated", key, x.obj.GetUID(), uids[key])
		}
	}
	return nil
}

// Shell runs line with bash in the repository root as a user's shell in
// a fresh terminal would, with DEMO_DIR set to this stack's directory: none
// of the variables the targets read (KUBECONFIG, IMAGE_REGISTRY, VERSION,
// ...) is inherited, so a developer's own cluster or registry is never
// touched. Its output goes to Logf line by line.
func (e *Env) Shell(ctx context.Context, line string) (time.Duration, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", line)
	cmd.Dir = root
	cmd.Env = append(cleanEnv(os.Environ()), "DEMO_DIR="+e.Cluster.Dir)
	w := &lineWriter{logf: e.Logf}
	cmd.Stdout, cmd.Stderr = w, w
	e.Logf("$ %s", line)
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	w.flush()
	if err != nil {
		return took, fmt.Errorf("%s: %w\n%s", line, err, w.tail())
	}
	return took, nil
}

// userVars are what the make targets and tools read from the
// environment; Shell never passes them on.
var userVars = regexp.MustCompile(`^(KUBECONFIG|SSL_CERT_FILE|IMAGE_REGISTRY|IMAGE_REGISTRY_INSECURE|VERSION|IMG|BUNDLE_IMG|BUNDLE_NAMESPACE|BUNDLE_TIMEOUT|DEMO_DIR|IMAGE_TAG_BASE|MAKEFLAGS|MFLAGS|MAKELEVEL|GNUMAKEFLAGS)=`)

func cleanEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if !userVars.MatchString(kv) {
			out = append(out, kv)
		}
	}
	return out
}

// lineWriter sends each complete line to logf and keeps the last lines
// for an error message.
type lineWriter struct {
	logf func(string, ...any)
	mu   sync.Mutex
	buf  bytes.Buffer
	last []string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.emit(strings.TrimRight(line, "\n"))
	}
}

func (w *lineWriter) emit(line string) {
	w.logf("  | %s", line)
	w.last = append(w.last, line)
	if len(w.last) > 30 {
		w.last = w.last[1:]
	}
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 0 {
		w.emit(w.buf.String())
		w.buf.Reset()
	}
}

func (w *lineWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.last, "\n")
}

// READMEDoc is the page, relative to the repository, holding the block
// READMEBlock reads (the README links to it).
const READMEDoc = "docs/install.md"

// READMEBlock returns the commands of the block of READMEDoc marked
// `<!-- test/e2e runs this block -->`, comments stripped, in order.
func READMEBlock() ([]string, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(root, READMEDoc))
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile("(?s)<!-- test/e2e runs this block -->\n```sh\n(.*?)```").FindSubmatch(raw)
	if m == nil {
		return nil, fmt.Errorf("%s has no ```sh block after <!-- test/e2e runs this block -->", READMEDoc)
	}
	var out []string
	for _, l := range strings.Split(string(m[1]), "\n") {
		if l = strings.TrimSpace(strings.SplitN(l, "#", 2)[0]); l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}
