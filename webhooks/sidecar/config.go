package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"text/template/parse"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	sigsyaml "sigs.k8s.io/yaml"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// Params are the inputs of Decide and Inject that do not come from the CR.
type Params struct {
	// OperatorNamespace is never injected.
	OperatorNamespace string
	// ExcludedNamespaces are never injected either: the namespaces the
	// operator's webhook configuration excludes besides the system ones,
	// the operator's and the CR's server namespace (every allowed server
	// namespace, internal/desired.InjectorExcludedNamespaces). The injector
	// leaves it empty, since the API server never sends it their pods; a
	// caller deciding outside admission (the operator, about running pods)
	// sets it, so that its answer is the webhook's.
	ExcludedNamespaces []string
	// SparedNamespaces are the part of ExcludedNamespaces spared
	// installation-wide (--excluded-namespaces, cert-manager's in mode
	// CertManager; internal/desired.InjectorSparedNamespaces): a pod there
	// is reported as spared (CodeSpared) instead of the operator's.
	SparedNamespaces []string
	// ServerVersion is the API server's version ("v1.31.2"); with
	// nativeSidecars Auto, sidecars are native from v1.29 (KEP-753
	// SidecarContainers beta, on by default). Empty or unparsable: not native.
	ServerVersion string
}

// nativeSince is the first Kubernetes minor with SidecarContainers on by default (KEP-753).
var nativeSince = utilversion.MajorMinor(1, 29)

// nativeDefault resolves spec.nativeSidecars against the server version.
func nativeDefault(mode v1alpha1.NativeSidecarMode, serverVersion string) bool {
	switch mode {
	case v1alpha1.NativeSidecarEnabled:
		return true
	case v1alpha1.NativeSidecarDisabled:
		return false
	}
	v, err := utilversion.ParseGeneric(serverVersion)
	if err != nil {
		return false
	}
	return v.AtLeast(nativeSince)
}

// Config is a compiled SidecarInjector: parsed templates, selectors and
// decoded values. It is immutable once built and safe for concurrent use.
type Config struct {
	// Name of the SidecarInjector.
	Name string
	// UID and Generation of the SidecarInjector this was compiled from.
	UID        types.UID
	Generation int64
	// Hash is a short sha256 of the spec fields that shape injection; it is
	// recorded in the status annotation.
	Hash string

	Policy            v1alpha1.InjectionPolicy
	InjectHostNetwork bool
	NativeSidecars    v1alpha1.NativeSidecarMode
	FailurePolicy     v1alpha1.FailurePolicy
	DefaultTemplates  []string
	// ServerNamespace is spec.server.namespace; like the operator's, never injected.
	ServerNamespace string

	templates map[string]*compiledTemplate
	// needsSpec: some template reads .Spec, so the pod spec is decoded.
	needsSpec         bool
	values            map[string]any
	namespaceSelector labels.Selector
	objectSelector    labels.Selector
	neverInject       []labels.Selector
	neverIdx          []int
	alwaysInject      []labels.Selector
	alwaysIdx         []int
	// decisionsOnly: built by ForDecisions, Inject refuses it.
	decisionsOnly bool
}

// ErrDecisionsOnly is Inject's error for a Config from ForDecisions.
var ErrDecisionsOnly = errors.New("sidecar config holds decisions only (ForDecisions): it cannot render")

// ForDecisions is c without what only rendering needs (its parsed
// templates with their bound functions, render caches and values): what
// Decide reads, and Hash. A holder of many configs that never renders (the
// operator's fleet keeps one per SidecarInjector, about 200 KiB each with
// the templates) keeps this instead. Inject on it returns
// ErrDecisionsOnly.
func (c *Config) ForDecisions() *Config {
	d := *c
	d.templates, d.values, d.decisionsOnly = nil, nil, true
	return &d
}

type compiledTemplate struct {
	name string
	// placement is spec.templates[].initContainerPlacement; the zero
	// value places init containers by the default rule.
	placement v1alpha1.InitContainerPlacement
	// tmpl is parsed and instrumented (see instrument) but never executed:
	// renders take a clone from units, whose functions are bound to the
	// clone's own budget.
	tmpl  *template.Template
	units sync.Pool
	// cache maps rendered YAML text to its prepared form: most pods render
	// the same text, and YAML parsing and re-encoding dominate render cost.
	cache renderCache
}

// renderCache is a map bounded in entries and bytes, emptied when full (a
// config's templates render few distinct outputs; a pod-specific one just
// misses). An output larger than renderCacheMaxEntry is never kept, so a
// pod annotation copied into the output cannot fill the cache alone.
type renderCache struct {
	mu    sync.RWMutex
	m     map[string]*preparedPart
	bytes int
}

const (
	renderCacheMax = 512
	// renderCacheMaxBytes bounds one template's cache (a SidecarInjector
	// has at most 32 templates, so 64 MiB a server at worst): the rendered
	// text plus its prepared JSON, counted three times (document, list
	// entries, native variants). A sidecar's prepared part is a few KiB.
	renderCacheMaxBytes = 2 << 20
	renderCacheMaxEntry = 64 << 10
)

func cacheCost(k []byte, v *preparedPart) int {
	n := len(k)
	if v != nil {
		n += 3 * len(v.json)
	}
	return n
}

func (c *renderCache) get(k []byte) (*preparedPart, bool) {
	c.mu.RLock()
	v, ok := c.m[string(k)]
	c.mu.RUnlock()
	return v, ok
}

func (c *renderCache) put(k []byte, v *preparedPart) {
	cost := cacheCost(k, v)
	if cost > renderCacheMaxEntry {
		return
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= renderCacheMax || c.bytes+cost > renderCacheMaxBytes {
		c.m = make(map[string]*preparedPart, 16)
		c.bytes = 0
	}
	if _, dup := c.m[string(k)]; !dup {
		c.m[string(k)] = v
		c.bytes += cost
	}
	c.mu.Unlock()
}

// Compile parses and checks a SidecarInjector. It fails when a template does
// not parse or does not render for a minimal pod, a defaultTemplates entry
// names no template or repeats one, a selector is invalid (such as a
// matchExpressions operator other than In, NotIn, Exists, DoesNotExist), or
// values is not a JSON object. The trial render is bounded like every render
// (maxRenderBytes, maxValueBytes, maxRenderSteps, maxRenderCPU,
// maxRenderWall); a template calling itself is rejected.
func Compile(cr *v1alpha1.SidecarInjector) (*Config, error) {
	return CompileContext(context.Background(), cr)
}

// CompileContext is Compile whose trial renders stop once ctx is done (the
// validating webhook's request was abandoned).
func CompileContext(ctx context.Context, cr *v1alpha1.SidecarInjector) (*Config, error) {
	cr = cr.WithDefaults() // a kube-inject --config file never met an API server
	s := &cr.Spec
	c := &Config{
		Name:              cr.Name,
		UID:               cr.UID,
		Generation:        cr.Generation,
		Policy:            s.Policy,
		InjectHostNetwork: s.InjectHostNetwork,
		NativeSidecars:    s.NativeSidecars,
		FailurePolicy:     s.FailurePolicy,
		DefaultTemplates:  append([]string(nil), s.DefaultTemplates...),
		ServerNamespace:   s.Server.Namespace,
		templates:         make(map[string]*compiledTemplate, len(s.Templates)),
	}
	if c.Policy != v1alpha1.PolicyEnabled && c.Policy != v1alpha1.PolicyDisabled {
		return nil, fmt.Errorf("spec.policy %q: want Enabled or Disabled", c.Policy)
	}
	var err error
	if c.namespaceSelector, err = optionalSelector(s.NamespaceSelector); err != nil {
		return nil, fmt.Errorf("spec.namespaceSelector: %w", err)
	}
	if c.objectSelector, err = optionalSelector(s.ObjectSelector); err != nil {
		return nil, fmt.Errorf("spec.objectSelector: %w", err)
	}
	if c.neverInject, c.neverIdx, err = selectorList(s.NeverInjectSelector); err != nil {
		return nil, fmt.Errorf("spec.neverInjectSelector%w", err)
	}
	if c.alwaysInject, c.alwaysIdx, err = selectorList(s.AlwaysInjectSelector); err != nil {
		return nil, fmt.Errorf("spec.alwaysInjectSelector%w", err)
	}
	c.values = map[string]any{}
	if s.Values != nil && len(s.Values.Raw) > 0 && string(s.Values.Raw) != "null" {
		dec := json.NewDecoder(bytes.NewReader(s.Values.Raw))
		dec.UseNumber()
		if err := dec.Decode(&c.values); err != nil {
			return nil, fmt.Errorf("spec.values must be a JSON object: %w", err)
		}
		if c.values == nil {
			c.values = map[string]any{}
		}
	}
	funcs := FuncMap()
	for _, t := range s.Templates {
		if _, dup := c.templates[t.Name]; dup {
			return nil, fmt.Errorf("spec.templates: duplicate name %q", t.Name)
		}
		tm, err := template.New(t.Name).Funcs(funcs).Parse(t.Template)
		if err != nil {
			return nil, fmt.Errorf("template %q: %w", t.Name, err)
		}
		if err := instrument(tm); err != nil {
			return nil, fmt.Errorf("template %q: %w", t.Name, err)
		}
		ct := &compiledTemplate{name: t.Name, tmpl: tm}
		if t.InitContainerPlacement != nil {
			if err := checkPlacement(*t.InitContainerPlacement); err != nil {
				return nil, fmt.Errorf("template %q: initContainerPlacement: %w", t.Name, err)
			}
			ct.placement = *t.InitContainerPlacement
		}
		c.templates[t.Name] = ct
		c.needsSpec = c.needsSpec || readsSpec(tm)
	}
	for i, d := range c.DefaultTemplates {
		if _, ok := c.templates[d]; !ok {
			return nil, fmt.Errorf("spec.defaultTemplates: no template named %q", d)
		}
		// The API rejects repeats (listType set); a --config file is not checked there.
		if slices.Contains(c.DefaultTemplates[:i], d) {
			return nil, fmt.Errorf("spec.defaultTemplates: %q listed twice", d)
		}
	}
	c.Hash = specHash(s)
	if cr.Spec.Revision != "" && cr.Status.Pinned != nil && cr.Status.Pinned.Revision == cr.Spec.Revision {
		// Served pins the spec to a kept revision: its name is the
		// ControllerRevision's, whatever the API server's re-encoding of
		// the values did to the bytes.
		c.Hash = cr.Spec.Revision
	}
	// A trial render catches templates that parse but fail at execution or
	// emit invalid YAML, before this config can replace a working one.
	for _, t := range s.Templates {
		for _, native := range []bool{false, true} {
			if _, err := c.renderOne(ctx, c.templates[t.Name], trialData(c, native)); err != nil {
				return nil, fmt.Errorf("trial render (nativeSidecars=%t): %w", native, err)
			}
		}
	}
	return c, nil
}

func trialData(c *Config, native bool) *templateData {
	return &templateData{
		ObjectMeta:     &metav1.ObjectMeta{Name: "example", Namespace: "default", Labels: map[string]string{"app": "example"}},
		Spec:           &corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example"}}},
		Namespace:      "default",
		Values:         deepCopyValue(c.values).(map[string]any),
		Injector:       c.Name,
		NativeSidecars: native,
	}
}

// checkPlacement is the API's validation of an initContainerPlacement
// (enum, CEL rule, name pattern), for a --config file that never met it.
func checkPlacement(p v1alpha1.InitContainerPlacement) error {
	switch p.Position {
	case v1alpha1.InitContainersFirst:
		if p.After != "" {
			return fmt.Errorf("after %q is not allowed with position First", p.After)
		}
	case v1alpha1.InitContainersAfter:
		if p.After == "" {
			return errors.New("after is required with position After")
		}
		if msgs := validation.IsDNS1123Label(p.After); len(msgs) > 0 {
			return fmt.Errorf("after %q: %s", short(p.After, 63), strings.Join(msgs, "; "))
		}
	default:
		return fmt.Errorf("position %q: want First or After", p.Position)
	}
	return nil
}

func optionalSelector(ls *metav1.LabelSelector) (labels.Selector, error) {
	if ls == nil {
		return nil, nil
	}
	return metav1.LabelSelectorAsSelector(ls)
}

// selectorList compiles never/alwaysInjectSelector. Empty selectors are
// dropped, as Istio does: matching every pod by accident is never intended.
func selectorList(in []metav1.LabelSelector) ([]labels.Selector, []int, error) {
	var out []labels.Selector
	var idx []int
	for i := range in {
		s, err := metav1.LabelSelectorAsSelector(&in[i])
		if err != nil {
			return nil, nil, fmt.Errorf("[%d]: %w", i, err)
		}
		if s.Empty() {
			continue
		}
		out = append(out, s)
		idx = append(idx, i)
	}
	return out, idx, nil
}

// specHash covers everything that changes what gets injected.
func specHash(s *v1alpha1.SidecarInjectorSpec) string {
	sum := sha256.Sum256(revisionData(s))
	return hex.EncodeToString(sum[:8])
}

// revisionData is the JSON of the spec fields that shape what is injected:
// templates (with their placement), default templates, values and the
// native sidecar mode. Selectors, policy, replicas and certificates are
// left out, so changing them keeps the revision.
func revisionData(s *v1alpha1.SidecarInjectorSpec) []byte {
	b, _ := json.Marshal(RevisionContent{Templates: s.Templates, DefaultTemplates: s.DefaultTemplates, Values: s.Values, NativeSidecars: s.NativeSidecars})
	return b
}

// RevisionContent is what a revision records of a SidecarInjector: the
// data of its ControllerRevisions. The field names are part of the hash,
// so they never change.
type RevisionContent struct {
	Templates        []v1alpha1.NamedTemplate   `json:"Templates"`
	DefaultTemplates []string                   `json:"DefaultTemplates"`
	Values           *apiextensionsv1.JSON      `json:"Values"`
	NativeSidecars   v1alpha1.NativeSidecarMode `json:"Native"`
}

// Revision is the revision of what cr injects (after the API's defaults):
// 16 hex digits of the sha256 of RevisionContent's JSON, the value of the
// pod label sidecar.hookwright.io/revision and of the status annotation's
// configHash. It changes only when templates, default templates, values or
// the native sidecar mode change. data is that JSON (a ControllerRevision's
// data).
func Revision(cr *v1alpha1.SidecarInjector) (revision string, data []byte) {
	s := &cr.WithDefaults().Spec
	return specHash(s), revisionData(s)
}

// Served is what cr's servers inject: cr itself, or with spec.revision
// set and status.pinned holding that revision (the operator copies it from
// the ControllerRevision), cr with the pinned templates, default
// templates, values and native sidecar mode in place of the spec's.
// revision is the revision served; resolved is false when spec.revision is
// set and status.pinned does not hold it yet (then eff is cr unchanged).
func Served(cr *v1alpha1.SidecarInjector) (eff *v1alpha1.SidecarInjector, revision string, resolved bool) {
	if cr.Spec.Revision == "" {
		rev, _ := Revision(cr)
		return cr, rev, true
	}
	p := cr.Status.Pinned
	if p == nil || p.Revision != cr.Spec.Revision {
		rev, _ := Revision(cr)
		return cr, rev, false
	}
	eff = cr.DeepCopy()
	eff.Spec.Templates = p.Templates
	eff.Spec.DefaultTemplates = p.DefaultTemplates
	eff.Spec.Values = p.Values
	eff.Spec.NativeSidecars = p.NativeSidecars
	return eff, cr.Spec.Revision, true
}

// Store holds the config being served. Update swaps it atomically; a config
// that does not compile never replaces the last good one.
type Store struct {
	cur     atomic.Pointer[Config]
	mu      sync.Mutex
	lastErr error
	// OnChange, when set, is called after every successful swap.
	OnChange func(*Config)
}

// Load returns the served config, or nil before the first successful Update.
func (s *Store) Load() *Config { return s.cur.Load() }

// update compiles cr and, on success, serves it. On failure the previous
// config stays and the compile error is returned (and kept for LastError).
func (s *Store) update(cr *v1alpha1.SidecarInjector) (*Config, error) {
	c, err := Compile(cr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.lastErr = fmt.Errorf("generation %d: %w", cr.Generation, err)
		return nil, s.lastErr
	}
	s.lastErr = nil
	s.cur.Store(c)
	if s.OnChange != nil {
		s.OnChange(c)
	}
	return c, nil
}

// Offer hands the store a version of the SidecarInjector it serves, as a
// watch delivers it (webhooks/configwatch). A version of another name, or
// of the generation, UID and revision already served (a status-only
// update, a resync), is ignored; a new one is compiled and served at once,
// pinned to spec.revision when status.pinned holds it (Served). While a
// pin is not resolved the last config stays (the spec's when none). One that
// does not compile is counted in m and logged, and the last good version
// stays. m records the served generation.
func (s *Store) Offer(name string, cr *v1alpha1.SidecarInjector, m *Metrics, log logr.Logger) {
	if cr == nil || cr.Name != name {
		return
	}
	eff, rev, resolved := Served(cr)
	cur := s.Load()
	if !resolved {
		log.Info("spec.revision is not in status.pinned yet", "revision", cr.Spec.Revision)
		if cur != nil {
			return // the operator's copy of the pinned revision is on its way
		}
	}
	if cur != nil && cur.Generation == cr.Generation && cur.UID == cr.UID && cur.Hash == rev {
		return
	}
	c, err := s.update(eff)
	if err != nil {
		m.recordConfigError(name)
		log.Error(err, "new SidecarInjector version rejected; still serving the last good one", "generation", cr.Generation)
		return
	}
	m.recordConfig(c)
	log.Info("serving SidecarInjector", "generation", c.Generation, "hash", c.Hash)
}

// lastError is the error of the last update, nil when it succeeded.
func (s *Store) lastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// ErrNoConfig is returned while no config has been loaded.
var ErrNoConfig = errors.New("no SidecarInjector configuration loaded yet")

// DecodeSidecarInjector reads a SidecarInjector from YAML or JSON (as
// kube-inject --config takes it). Unknown fields are an error, so a typo in
// an offline config is not silently ignored.
//
// apiVersion and kind are checked first, so another object (a Pod given as
// the config) is named as such rather than reported as unknown fields.
func DecodeSidecarInjector(b []byte) (*v1alpha1.SidecarInjector, error) {
	var tm metav1.TypeMeta
	if err := sigsyaml.Unmarshal(b, &tm); err != nil {
		return nil, fmt.Errorf("decoding SidecarInjector: %w", err)
	}
	if tm.APIVersion != v1alpha1.GroupVersion.String() || tm.Kind != "SidecarInjector" {
		return nil, fmt.Errorf("not a SidecarInjector: got apiVersion %q kind %q, want apiVersion %s kind SidecarInjector", tm.APIVersion, tm.Kind, v1alpha1.GroupVersion)
	}
	cr := &v1alpha1.SidecarInjector{}
	if err := sigsyaml.UnmarshalStrict(b, cr); err != nil {
		return nil, fmt.Errorf("decoding SidecarInjector: %w", err)
	}
	return cr, nil
}

// readsSpec tells whether a template can reach the pod's .Spec: a field
// chain starting at .Spec or $.Spec, the root dot or $ passed whole to a
// function, or a {{template}} call. When no template can, inject skips
// decoding the pod's spec (its containers can be megabytes). The analysis is
// conservative: unknown node types count as reading it.
func readsSpec(t *template.Template) bool {
	for _, tt := range t.Templates() {
		if tt.Tree != nil && nodeReadsSpec(tt.Tree.Root, true) {
			return true
		}
	}
	return false
}

func nodeReadsSpec(n parse.Node, dotIsRoot bool) bool {
	switch n := n.(type) {
	case nil:
		return false
	case *parse.ListNode:
		if n == nil {
			return false
		}
		for _, c := range n.Nodes {
			if nodeReadsSpec(c, dotIsRoot) {
				return true
			}
		}
		return false
	case *parse.TextNode, *parse.CommentNode, *parse.BreakNode, *parse.ContinueNode:
		return false
	case *parse.ActionNode:
		return pipeReadsSpec(n.Pipe, dotIsRoot)
	case *parse.IfNode:
		return branchReadsSpec(&n.BranchNode, dotIsRoot, dotIsRoot)
	case *parse.WithNode:
		return branchReadsSpec(&n.BranchNode, dotIsRoot, dotIsRoot && isBareDot(n.Pipe))
	case *parse.RangeNode:
		return branchReadsSpec(&n.BranchNode, dotIsRoot, false)
	}
	return true
}

func branchReadsSpec(b *parse.BranchNode, dotIsRoot, bodyRoot bool) bool {
	return pipeReadsSpec(b.Pipe, dotIsRoot) || nodeReadsSpec(b.List, bodyRoot) || nodeReadsSpec(b.ElseList, dotIsRoot)
}

func isBareDot(p *parse.PipeNode) bool {
	if p == nil || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return false
	}
	_, ok := p.Cmds[0].Args[0].(*parse.DotNode)
	return ok
}

func pipeReadsSpec(p *parse.PipeNode, dotIsRoot bool) bool {
	if p == nil {
		return false
	}
	for _, c := range p.Cmds {
		for _, a := range c.Args {
			if argReadsSpec(a, dotIsRoot) {
				return true
			}
		}
	}
	return false
}

func argReadsSpec(a parse.Node, dotIsRoot bool) bool {
	switch a := a.(type) {
	case *parse.DotNode:
		return dotIsRoot
	case *parse.FieldNode:
		return dotIsRoot && len(a.Ident) > 0 && a.Ident[0] == "Spec"
	case *parse.VariableNode:
		return a.Ident[0] == "$" && (len(a.Ident) == 1 || a.Ident[1] == "Spec")
	case *parse.ChainNode:
		return slices.Contains(a.Field, "Spec") || argReadsSpec(a.Node, dotIsRoot)
	case *parse.PipeNode:
		return pipeReadsSpec(a, dotIsRoot)
	case *parse.IdentifierNode, *parse.StringNode, *parse.NumberNode, *parse.BoolNode, *parse.NilNode:
		return false
	}
	return true
}
