package olm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/test/cluster"
)

// File-based catalog schemas (operator-registry alpha/declcfg).
const (
	SchemaPackage = "olm.package"
	SchemaChannel = "olm.channel"
	SchemaBundle  = "olm.bundle"
)

// Bundle annotation keys (bundle/metadata/annotations.yaml).
const (
	AnnotationPackage        = "operators.operatorframework.io.bundle.package.v1"
	AnnotationChannels       = "operators.operatorframework.io.bundle.channels.v1"
	AnnotationDefaultChannel = "operators.operatorframework.io.bundle.channel.default.v1"
)

// Bundle is a bundle directory rendered by `opm render`: its olm.bundle
// catalog object, with the manifests inline as olm.bundle.object properties.
type Bundle struct {
	// Name is the ClusterServiceVersion's name, e.g. hookwright.v0.1.0.
	Name string
	// Package is the OLM package name.
	Package string
	// Channels and DefaultChannel come from metadata/annotations.yaml.
	Channels       []string
	DefaultChannel string
	// Dir is the bundle directory rendered.
	Dir string
	// Object is the olm.bundle object, its image field emptied (see the
	// package doc: an image would make OLM unpack it with a Job).
	Object map[string]any
}

// RenderBundle runs `opm render dir` and returns the bundle's olm.bundle
// object. dir is an operator bundle directory (manifests/, metadata/).
func RenderBundle(ctx context.Context, opm, dir string) (*Bundle, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, opm, "render", dir, "-o", "json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("opm render %s: %v: %s", dir, err, stderr.String())
	}
	dec := json.NewDecoder(&stdout)
	var found []map[string]any
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("opm render %s: decode output: %w", dir, err)
		}
		if obj["schema"] == SchemaBundle {
			found = append(found, obj)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("opm render %s: want exactly one %s object, got %d", dir, SchemaBundle, len(found))
	}
	obj := found[0]
	b := &Bundle{Dir: dir, Object: obj}
	b.Name, _ = obj["name"].(string)
	b.Package, _ = obj["package"].(string)
	if b.Name == "" || b.Package == "" {
		return nil, fmt.Errorf("opm render %s: %s object without name or package", dir, SchemaBundle)
	}
	if !hasBundleObjects(obj) {
		return nil, fmt.Errorf("opm render %s: no olm.bundle.object properties: OLM would need the bundle image to install it", dir)
	}
	obj["image"] = ""

	ann, err := readAnnotations(dir)
	if err != nil {
		return nil, err
	}
	if p := ann[AnnotationPackage]; p != "" && p != b.Package {
		return nil, fmt.Errorf("bundle %s: annotations.yaml package %q, CSV package %q", dir, p, b.Package)
	}
	for _, ch := range strings.Split(ann[AnnotationChannels], ",") {
		if ch = strings.TrimSpace(ch); ch != "" {
			b.Channels = append(b.Channels, ch)
		}
	}
	b.DefaultChannel = ann[AnnotationDefaultChannel]
	if b.DefaultChannel == "" && len(b.Channels) > 0 {
		b.DefaultChannel = b.Channels[0]
	}
	if b.DefaultChannel == "" {
		return nil, fmt.Errorf("bundle %s: metadata/annotations.yaml names no channel (%s)", dir, AnnotationChannels)
	}
	return b, nil
}

func hasBundleObjects(obj map[string]any) bool {
	props, _ := obj["properties"].([]any)
	for _, p := range props {
		if m, _ := p.(map[string]any); m["type"] == "olm.bundle.object" {
			return true
		}
	}
	return false
}

func readAnnotations(dir string) (map[string]string, error) {
	path := filepath.Join(dir, "metadata", "annotations.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", dir, err)
	}
	var f struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f.Annotations, nil
}

// BuildCatalog returns the objects of a file-based catalog with one package
// and one channel whose entries are bundles in upgrade order: each bundle
// after the first replaces the one before it (the channel entry's replaces,
// which is what an FBC upgrade graph follows). All bundles must be of one
// package.
func BuildCatalog(channel string, bundles ...*Bundle) ([]map[string]any, error) {
	if len(bundles) == 0 {
		return nil, errors.New("catalog: no bundles")
	}
	pkg := bundles[0].Package
	if channel == "" {
		channel = bundles[0].DefaultChannel
	}
	entries := make([]any, 0, len(bundles))
	objs := []map[string]any{{"schema": SchemaPackage, "name": pkg, "defaultChannel": channel}}
	chIdx := len(objs)
	objs = append(objs, nil)
	seen := map[string]bool{}
	for i, b := range bundles {
		if b.Package != pkg {
			return nil, fmt.Errorf("catalog: bundle %s is of package %q, not %q", b.Name, b.Package, pkg)
		}
		if seen[b.Name] {
			return nil, fmt.Errorf("catalog: bundle %s twice", b.Name)
		}
		seen[b.Name] = true
		e := map[string]any{"name": b.Name}
		if i > 0 {
			e["replaces"] = bundles[i-1].Name
		}
		entries = append(entries, e)
		objs = append(objs, b.Object)
	}
	objs[chIdx] = map[string]any{"schema": SchemaChannel, "package": pkg, "name": channel, "entries": entries}
	return objs, nil
}

// WriteCatalog writes objs as dir/catalog.json (a JSON stream, one object a
// line) and checks it with `opm validate dir`.
func WriteCatalog(ctx context.Context, opm, dir string, objs []map[string]any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, o := range objs {
		if err := enc.Encode(o); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "catalog.json"), buf.Bytes(), 0o644); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, opm, "validate", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("opm validate %s: %v: %s", dir, err, out)
	}
	return nil
}

// CatalogServer is an `opm serve` process serving a file-based catalog over
// gRPC on 127.0.0.1.
type CatalogServer struct {
	// Addr is host:port of the gRPC registry API.
	Addr string
	// Dir is the catalog directory served.
	Dir  string
	o    *OLM
	proc *cluster.Process
}

// ServeCatalog starts `opm serve dir` on a free port and returns once it
// serves (opm logs "serving registry" after loading the catalog, then
// listens). A port taken between choosing and binding it is retried.
func (o *OLM) ServeCatalog(ctx context.Context, name, dir string) (*CatalogServer, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var s *CatalogServer
		var retry bool
		if s, retry, err = o.serveCatalog(ctx, name, dir); err == nil {
			o.logf("olm: opm serve %s on %s", dir, s.Addr)
			return s, nil
		}
		if !retry {
			break
		}
	}
	return nil, err
}

func (o *OLM) serveCatalog(ctx context.Context, name, dir string) (s *CatalogServer, retry bool, err error) {
	port, err := cluster.FreePort()
	if err != nil {
		return nil, false, err
	}
	args := []string{"serve", dir, "-p", strconv.Itoa(port),
		// No pprof listener (default localhost:6060 would clash between
		// servers) and no /dev/termination-log.
		"--pprof-addr=", "-t", filepath.Join(o.Dir, "logs", name+".termination.log"),
	}
	// opm keeps its cache in a temp dir: under o.Dir, so a killed opm
	// leaves nothing behind once the cluster's dir is removed.
	env := []string{"TMPDIR=" + o.Dir}
	p, err := cluster.StartProcess(name, filepath.Join(o.Dir, "logs"), filepath.Join(o.Cluster.Bin, "opm"), args, env)
	if err != nil {
		return nil, false, err
	}
	o.track(p)
	s = &CatalogServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, o: o, proc: p}
	err = cluster.WaitFor(ctx, 2*time.Minute, "opm serve "+dir+" on "+s.Addr, func(ctx context.Context) (bool, error) {
		if done, perr := p.Exited(); done {
			tail := p.Tail(2000)
			retry = strings.Contains(tail, "address already in use")
			return false, cluster.Permanent(fmt.Errorf("opm serve exited (%v); log tail:\n%s", perr, tail))
		}
		if !strings.Contains(p.Tail(4000), "serving registry") {
			return false, errors.New(`no "serving registry" in its log yet`)
		}
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", s.Addr)
		if err != nil {
			return false, err
		}
		_ = c.Close()
		return true, nil
	})
	if err != nil {
		s.Stop()
		return nil, retry, err
	}
	return s, false, nil
}

// Stop ends the opm serve process.
func (s *CatalogServer) Stop() {
	_ = s.proc.Stop(10 * time.Second)
	s.o.untrack(s.proc)
}

// ApplyCatalogSource creates or updates the grpc CatalogSource
// o.Namespace/name with spec.address addr, and waits until the catalog
// operator reports a READY connection to that address. OLM re-resolves the
// subscriptions of a catalog whose connection becomes READY (catalog
// operator syncSourceState), so pointing a source at a new address is how a
// new catalog content is published.
func (o *OLM) ApplyCatalogSource(ctx context.Context, name, addr string, timeout time.Duration) error {
	cs := &operatorsv1alpha1.CatalogSource{}
	key := client.ObjectKey{Namespace: o.Namespace, Name: name}
	err := o.Client.Get(ctx, key, cs)
	switch {
	case apierrors.IsNotFound(err):
		cs = &operatorsv1alpha1.CatalogSource{
			ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: name},
			Spec: operatorsv1alpha1.CatalogSourceSpec{
				SourceType:  operatorsv1alpha1.SourceTypeGrpc,
				Address:     addr,
				DisplayName: name,
				Publisher:   "hookwright tests",
			},
		}
		err = o.Client.Create(ctx, cs)
	case err == nil:
		cs.Spec.Address = addr
		err = o.Client.Update(ctx, cs)
	}
	if err != nil {
		return fmt.Errorf("catalogsource %s: %w", key, err)
	}
	return o.wait(ctx, timeout, fmt.Sprintf("catalogsource %s READY at %s", key, addr), func(ctx context.Context) (bool, error) {
		if err := o.Client.Get(ctx, key, cs); err != nil {
			return false, err
		}
		st := cs.Status.GRPCConnectionState
		if st == nil {
			return false, errors.New("no connection state yet")
		}
		if st.Address != addr || st.LastObservedState != "READY" {
			return false, fmt.Errorf("connection state %s at %s", st.LastObservedState, st.Address)
		}
		return true, nil
	})
}

// wait is cluster.WaitFor that also fails at once when an OLM process died.
func (o *OLM) wait(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	return cluster.WaitFor(ctx, timeout, what, func(ctx context.Context) (bool, error) {
		if err := o.Alive(); err != nil {
			return false, cluster.Permanent(err)
		}
		return cond(ctx)
	})
}
