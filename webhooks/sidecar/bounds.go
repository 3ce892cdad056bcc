package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"text/template"
	"text/template/parse"
	"time"
)

// Render limits. text/template has no context and no budget, so a template
// is bounded four ways: what it writes passes through a writer that fails
// past maxRenderBytes; every range iteration, call of a defined template
// and call of a sprig function is a step, capped at maxRenderSteps, that
// also checks the CPU budget (maxRenderCPU), the outer wall-clock bound
// (maxRenderWall) and the request's context; every value a function takes
// or returns is measured against maxValueBytes (so until, repeat, a
// doubling cat loop or a list holding itself fail before they grow); and
// functions that cost seconds of CPU by design (key and certificate
// generation, password hashing) are not available; those whose one call
// costs the product of their inputs (regular expressions, uniq, without)
// are priced first against maxCallWork. Templates that call themselves are
// rejected at compile time (see instrument).
const (
	// maxRenderBytes caps one template's output. A pod's annotations may
	// total 256 KiB (TotalAnnotationSizeLimitB in
	// k8s.io/apimachinery/pkg/api/validation) and an object in etcd
	// 1.5 MiB (etcd's --max-request-bytes default), so a larger partial pod
	// can never be admitted.
	maxRenderBytes = 1 << 20
	// maxValueBytes caps the approximate size (string bytes, 8 per scalar,
	// 16 plus twice its depth per element, 8 per struct field) of the
	// arguments of a template function call and of its result. A value
	// larger than any output can be could only feed an amplifier.
	maxValueBytes = 1 << 20
	// maxRenderSteps caps range iterations, template calls and function
	// calls in one render (a step costs about 0.1 to 0.5 µs).
	maxRenderSteps = 100_000
	// maxRenderCPU caps the CPU time of one template's execution: the
	// render's own, read from its OS thread's CPU clock (threadCPUTime)
	// while the render's goroutine is locked to that thread, so time spent
	// waiting for a CPU does not count and the bound means the same at any
	// machine load. A normal render takes well under a millisecond. Before
	// the meter this bound was wall time and denied 1 render in about
	// 6,000 in TestSoakSlowClients at load 20-35 on 2 cores.
	maxRenderCPU = 500 * time.Millisecond
	// maxRenderWall is the outer wall-clock bound of one execution, for
	// what the CPU clock cannot see: a thread without a readable CPU clock
	// and a render starved of CPU for longer than any caller waits. It is
	// the API server's default webhook timeoutSeconds (10 s, twice the
	// SidecarInjector's default): by then the API server has given up on
	// the call unless the CR raised its timeout further, which the
	// request's own deadline (read with the clocks) bounds anyway.
	// kube-inject, check-inject and the validating webhook's trial renders
	// get the same bounds.
	maxRenderWall = 10 * time.Second
	// maxCallWork caps what one function call may cost before it starts,
	// for the functions whose CPU grows with the product of their inputs
	// and cannot be interrupted: a regular expression search (regexMatch,
	// regexFind, regexFindAll, regexSplit, regexReplaceAll*) costs its
	// compiled program's instructions times the input's bytes, one unit
	// each; uniq and without compare every pair of elements, one unit per
	// 16 measured bytes (a scalar element) compared. The all-matches
	// functions search one match at a time, each within this budget, and
	// read the render clock between searches. At the cap one call takes
	// at most about 11 ms (BenchmarkCallWork, 2-core AMD EPYC).
	maxCallWork = 1 << 20
	// maxRegexBytes caps a regular expression's length; no sidecar needs a
	// longer one, and a long one only raises a search's cost.
	maxRegexBytes = 4096
)

// renderCPU and renderWall are maxRenderCPU and maxRenderWall; cpuMeter
// reads the render thread's CPU clock. Tests shorten the budgets, raise
// them so a slow machine (the race detector) cannot hit them before the
// limit under test, or replace the meter.
var (
	renderCPU  = maxRenderCPU
	renderWall = maxRenderWall
	cpuMeter   = threadCPUTime
)

// limitError is a render stopped by one of the render limits. It names the
// limit (as the constant's name) and its value, so the denial says what to
// change.
type limitError struct {
	// Limit is the constant's name, e.g. "maxRenderBytes".
	Limit string
	// Max is the limit's value in its unit, Unit that unit.
	Max  int64
	Unit string
	// What describes what exceeded it.
	What string
}

func (e *limitError) Error() string {
	return fmt.Sprintf("%s: over the render limit %s (%d %s)", e.What, e.Limit, e.Max, e.Unit)
}

func outputLimitError() error {
	return &limitError{Limit: "MaxRenderBytes", Max: maxRenderBytes, Unit: "bytes", What: "rendered output"}
}

func valueLimitError(what string) error {
	return &limitError{Limit: "MaxValueBytes", Max: maxValueBytes, Unit: "bytes", What: what}
}

// renderState is the budget of one execution. Each pooled template clone
// owns one and its functions are bound to it, so concurrent renders never
// share a budget.
type renderState struct {
	ctx context.Context
	// cpuStart is the thread's CPU clock when the render started; cpuOK is
	// false when it could not be read, and then the CPU budget is measured
	// on the wall clock from start.
	cpuStart time.Duration
	cpuOK    bool
	start    time.Time
	steps    int
	written  int
}

// reset starts a render's budget. The caller must hold the render's
// goroutine on its OS thread (runtime.LockOSThread) until the render ends,
// or the CPU clock read here and at each check is not the render's.
func (s *renderState) reset(ctx context.Context, now time.Time) {
	s.ctx = ctx
	s.start = now
	s.cpuStart, s.cpuOK = cpuMeter()
	s.steps = 0
	s.written = 0
}

// step counts one unit of work. The clocks and the context are read every
// 64 steps: often enough to stop within microseconds of a limit, rarely
// enough to cost nothing in a normal render. A nil state (FuncMap's
// functions) counts nothing.
func (s *renderState) step() error {
	if s == nil {
		return nil
	}
	s.steps++
	if s.steps > maxRenderSteps {
		return &limitError{Limit: "MaxRenderSteps", Max: maxRenderSteps, Unit: "steps", What: "the render's steps (range iterations, template and function calls)"}
	}
	if s.steps&63 == 0 {
		return s.checkTime()
	}
	return nil
}

// checkTime checks the request's context, the CPU budget and the outer
// wall-clock bound. A render that stays within the CPU budget in wall time
// reads only the wall clock; the thread's CPU clock is read once at its
// start (reset) and then only when it has run longer than the budget.
func (s *renderState) checkTime() error {
	if s.ctx != nil {
		if err := s.ctx.Err(); err != nil {
			return err
		}
	}
	if s.start.IsZero() {
		return nil
	}
	// One thread cannot use more CPU time than wall time passes, so below
	// the CPU budget in wall time there is no clock to read (a reading is a
	// system call, about 1 µs here: BenchmarkCPUMeter).
	wall := time.Since(s.start)
	if wall > renderCPU {
		cpu := wall
		if s.cpuOK {
			if now, ok := cpuMeter(); ok {
				cpu = now - s.cpuStart
			}
		}
		if cpu > renderCPU {
			return &limitError{Limit: "MaxRenderCPUTime", Max: renderCPU.Milliseconds(), Unit: "ms of CPU", What: "render CPU time"}
		}
	}
	if wall > renderWall {
		return &limitError{Limit: "MaxRenderWallTime", Max: renderWall.Milliseconds(), Unit: "ms", What: "render wall time"}
	}
	return nil
}

// limitedWriter is the template's output: bytes go to buf until
// maxRenderBytes is passed, then Execute stops with that error.
type limitedWriter struct {
	st  *renderState
	buf *bytes.Buffer
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if w.st.written+len(p) > maxRenderBytes {
		return 0, outputLimitError()
	}
	w.st.written += len(p)
	return w.buf.Write(p)
}

// measure returns the approximate size of v (see maxValueBytes), stopping as
// soon as it passes limit (ok false). It visits every element, so a value
// that holds itself (set $d "k" $d) or shares one list many times is
// measured as large as it prints.
func measure(v any, limit int) (int, bool) {
	n := 0
	ok := measureInto(v, 0, &n, limit)
	return n, ok
}

func measureInto(v any, depth int, n *int, limit int) bool {
	switch x := v.(type) {
	case nil, bool, int, int64, float64, int32, uint64, uint32, uint:
		*n += 8
	case string:
		*n += len(x) + 8
	case json.Number:
		*n += len(x) + 8
	case []byte:
		*n += len(x) + 8
	case []string:
		for _, e := range x {
			*n += len(e) + 16 + 2*depth
		}
	case []int:
		*n += len(x) * (16 + 2*depth)
	case map[string]string:
		for k, e := range x {
			*n += len(k) + len(e) + 16 + 2*depth
		}
	case []any:
		for _, e := range x {
			*n += 16 + 2*depth
			if *n > limit || !measureInto(e, depth+1, n, limit) {
				return false
			}
		}
	case map[string]any:
		for k, e := range x {
			*n += len(k) + 16 + 2*depth
			if *n > limit || !measureInto(e, depth+1, n, limit) {
				return false
			}
		}
	default:
		return measureValue(reflect.ValueOf(v), depth, n, limit)
	}
	return *n <= limit
}

// measureValue walks what a type switch cannot name (pod structs, typed
// maps); unexported fields count too, as fmt prints them.
func measureValue(v reflect.Value, depth int, n *int, limit int) bool {
	*n += 8
	if *n > limit {
		return false
	}
	switch v.Kind() {
	case reflect.String:
		*n += v.Len()
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return measureValue(v.Elem(), depth, n, limit)
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			*n += v.Len()
			break
		}
		for i := 0; i < v.Len(); i++ {
			*n += 8 + 2*depth
			if !measureValue(v.Index(i), depth+1, n, limit) {
				return false
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			*n += 8 + 2*depth
			if !measureValue(it.Key(), depth+1, n, limit) || !measureValue(it.Value(), depth+1, n, limit) {
				return false
			}
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if !measureValue(v.Field(i), depth+1, n, limit) {
				return false
			}
		}
	}
	return *n <= limit
}

// checkValue fails when v is larger than maxValueBytes.
func checkValue(what string, v any) error {
	if _, ok := measure(v, maxValueBytes); !ok {
		return valueLimitError(what)
	}
	return nil
}

// Names of the functions the engine inserts into parsed templates.
const (
	stepFunc = "hookwrightStep"
	outFunc  = "hookwrightOut"
)

// instrument rewrites a parsed template set in place so every range
// iteration and the body of every template called by {{template}} starts
// with a step. When the set calls a function that mutates a map (set,
// unset, merge...), a value measured when it was made can grow later
// through a shared reference, so then every action that prints a value not
// already a bounded string passes it through outFunc, which measures it
// before fmt expands it; without mutators every printed value was measured
// when made or is the pod's or the CR's own data. It rejects templates that
// call themselves, directly or through others: text/template allows
// 100,000 nested calls, each holding stack, and no sidecar needs recursion.
func instrument(t *template.Template) error {
	mutates := false
	for _, tt := range t.Templates() {
		if tt.Tree != nil && tt.Root != nil && callsAny(tt.Root, mutators) {
			mutates = true
		}
	}
	calls := map[string][]string{}
	called := map[string]bool{}
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Root == nil {
			continue
		}
		name := tt.Name()
		instrumentList(tt.Root, mutates, func(callee string) {
			calls[name] = append(calls[name], callee)
			called[callee] = true
		})
	}
	for _, tt := range t.Templates() {
		if tt.Tree != nil && tt.Root != nil && called[tt.Name()] {
			tt.Root.Nodes = slices.Insert(tt.Root.Nodes, 0, stepNode(tt.Root.Position()))
		}
	}
	// Depth-first search for a cycle in the call graph.
	state := map[string]int{} // 1 on the stack, 2 done
	var visit func(string, []string) error
	visit = func(n string, path []string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("recursive template call %v is not allowed", append(path, n))
		case 2:
			return nil
		}
		state[n] = 1
		for _, c := range calls[n] {
			if err := visit(c, append(path, n)); err != nil {
				return err
			}
		}
		state[n] = 2
		return nil
	}
	names := make([]string, 0, len(calls))
	for n := range calls {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := visit(n, nil); err != nil {
			return err
		}
	}
	return nil
}

// mutators are the sprig functions that change a map in place.
var mutators = map[string]bool{
	"set": true, "unset": true, "merge": true, "mergeOverwrite": true, "mustMerge": true, "mustMergeOverwrite": true,
}

// callsAny reports whether any identifier (function name) under n is in names.
func callsAny(n parse.Node, names map[string]bool) bool {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return false
		}
		for _, c := range n.Nodes {
			if callsAny(c, names) {
				return true
			}
		}
	case *parse.ActionNode:
		return callsAny(n.Pipe, names)
	case *parse.IfNode:
		return callsAny(n.Pipe, names) || callsAny(n.List, names) || callsAny(n.ElseList, names)
	case *parse.WithNode:
		return callsAny(n.Pipe, names) || callsAny(n.List, names) || callsAny(n.ElseList, names)
	case *parse.RangeNode:
		return callsAny(n.Pipe, names) || callsAny(n.List, names) || callsAny(n.ElseList, names)
	case *parse.TemplateNode:
		return callsAny(n.Pipe, names)
	case *parse.PipeNode:
		if n == nil {
			return false
		}
		for _, c := range n.Cmds {
			for _, a := range c.Args {
				if callsAny(a, names) {
					return true
				}
			}
		}
	case *parse.ChainNode:
		return callsAny(n.Node, names)
	case *parse.IdentifierNode:
		return names[n.Ident]
	}
	return false
}

func instrumentList(l *parse.ListNode, outs bool, call func(string)) {
	if l == nil {
		return
	}
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.ActionNode:
			if outs && len(n.Pipe.Decl) == 0 && !n.Pipe.IsAssign && !endsBounded(n.Pipe) {
				n.Pipe.Cmds = append(n.Pipe.Cmds, &parse.CommandNode{NodeType: parse.NodeCommand, Pos: n.Pos,
					Args: []parse.Node{parse.NewIdentifier(outFunc).SetPos(n.Pos)}})
			}
		case *parse.IfNode:
			instrumentList(n.List, outs, call)
			instrumentList(n.ElseList, outs, call)
		case *parse.WithNode:
			instrumentList(n.List, outs, call)
			instrumentList(n.ElseList, outs, call)
		case *parse.RangeNode:
			instrumentList(n.List, outs, call)
			instrumentList(n.ElseList, outs, call)
			if n.List != nil {
				n.List.Nodes = slices.Insert(n.List.Nodes, 0, stepNode(n.List.Position()))
			}
		case *parse.TemplateNode:
			call(n.Name)
		}
	}
}

func stepNode(pos parse.Pos) parse.Node {
	return &parse.ActionNode{NodeType: parse.NodeAction, Pos: pos, Pipe: &parse.PipeNode{NodeType: parse.NodePipe, Pos: pos,
		Cmds: []*parse.CommandNode{{NodeType: parse.NodeCommand, Pos: pos, Args: []parse.Node{parse.NewIdentifier(stepFunc).SetPos(pos)}}}}}
}

// boundedString lists functions that always return a string already
// measured (or small by construction): an action ending in one needs no
// outFunc.
var boundedString = map[string]bool{
	"quote": true, "squote": true, "toJSON": true, "toJson": true, "toYAML": true, "toYaml": true,
	"indent": true, "nindent": true, "printf": true, "print": true, "println": true,
	"repeat": true, "replace": true, "join": true, "toString": true, "cat": true, "trim": true,
	"upper": true, "lower": true, "b64enc": true, "sha256sum": true, "podName": true,
	outFunc: true, stepFunc: true,
}

func endsBounded(p *parse.PipeNode) bool {
	if len(p.Cmds) == 0 {
		return false
	}
	last := p.Cmds[len(p.Cmds)-1]
	if len(last.Args) == 0 {
		return false
	}
	id, ok := last.Args[0].(*parse.IdentifierNode)
	return ok && boundedString[id.Ident]
}

// printOut is outFunc: v as text/template would print it, after checking
// its printed form cannot pass maxRenderBytes by much.
func printOut(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "<no value>", nil // what text/template prints for a missing or nil value
	case string:
		return x, nil
	case json.Number:
		return string(x), nil
	}
	if _, ok := measure(v, maxRenderBytes); !ok {
		return "", outputLimitError()
	}
	return fmt.Sprint(v), nil
}
