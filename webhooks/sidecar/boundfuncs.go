package sidecar

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
)

// droppedFuncs cannot be bounded below seconds of CPU a call (see FuncMap).
var droppedFuncs = []string{
	"env", "expandenv", "getHostByName",
	"genPrivateKey", "genCA", "genCAWithKey", "genSelfSignedCert", "genSelfSignedCertWithKey",
	"genSignedCert", "genSignedCertWithKey", "buildCustomCert", "derivePassword", "bcrypt", "htpasswd",
}

// passThrough functions return a scalar, one of their arguments, or part of
// one, in time linear in their input: they need no wrapper. Everything else
// from sprig is wrapped by boundGeneric.
var passThrough = map[string]bool{
	"hello": true, "contains": true, "hasPrefix": true, "hasSuffix": true, "trim": true, "trimAll": true,
	"trimall": true, "trimSuffix": true, "trimPrefix": true, "trunc": true, "substr": true, "abbrev": true,
	"abbrevboth": true, "initials": true, "nospace": true, "plural": true, "sha1sum": true, "sha256sum": true,
	"sha512sum": true, "adler32sum": true, "atoi": true, "int": true, "int64": true, "float64": true,
	"toDecimal": true, "add1": true, "add": true, "sub": true, "div": true, "mod": true, "mul": true,
	"randInt": true, "add1f": true, "addf": true, "subf": true, "divf": true, "mulf": true, "biggest": true,
	"max": true, "min": true, "maxf": true, "minf": true, "ceil": true, "floor": true, "round": true,
	"default": true, "empty": true, "coalesce": true, "all": true, "any": true, "ternary": true,
	"typeOf": true, "typeIs": true, "typeIsLike": true, "kindOf": true, "kindIs": true,
	"base": true, "dir": true, "clean": true, "ext": true, "isAbs": true, "osBase": true, "osClean": true,
	"osDir": true, "osExt": true, "osIsAbs": true, "b64dec": true, "b32dec": true, "get": true,
	"hasKey": true, "first": true, "mustFirst": true, "last": true, "mustLast": true, "has": true,
	"mustHas": true, "uuidv4": true, "semver": true, "semverCompare": true, "fail": true,
	"regexQuoteMeta": true, "now": true, "ago": true,
	"date_modify": true, "dateModify": true, "must_date_modify": true,
	"mustDateModify": true, "duration": true, "durationRound": true, "htmlDate": true,
	"htmlDateInZone": true, "mustToDate": true, "toDate": true, "unixEpoch": true,
}

// funcMap returns the template functions bound to st.
func funcMap(st *renderState) template.FuncMap {
	f := sprig.TxtFuncMap()
	for _, n := range droppedFuncs {
		delete(f, n)
	}
	for name, fn := range f {
		if !passThrough[name] {
			f[name] = boundGeneric(st, name, fn)
		}
	}
	// Builtins that format their arguments with fmt, which expands shared
	// or self-containing values.
	f["html"] = boundGeneric(st, "html", template.HTMLEscaper)
	f["js"] = boundGeneric(st, "js", template.JSEscaper)
	f["urlquery"] = boundGeneric(st, "urlquery", template.URLQueryEscaper)
	f["print"] = func(args ...any) (string, error) { return boundSprint(fmt.Sprint, args) }
	f["println"] = func(args ...any) (string, error) { return boundSprint(fmt.Sprintln, args) }
	f["printf"] = boundPrintf

	f["until"] = func(n int) ([]int, error) {
		step := 1
		if n < 0 {
			step = -1
		}
		return boundUntilStep(0, n, step)
	}
	f["untilStep"] = boundUntilStep
	f["seq"] = boundSeq
	f["repeat"] = func(count int, s string) (string, error) {
		if count < 0 {
			return "", fmt.Errorf("repeat: negative count %d", count)
		}
		if err := checkSize("repeat", int64(count)*int64(len(s))); err != nil {
			return "", err
		}
		return strings.Repeat(s, count), nil
	}
	f["indent"] = func(n int, s string) (string, error) { return boundIndent("indent", n, s, "") }
	f["nindent"] = func(n int, s string) (string, error) { return boundIndent("nindent", n, s, "\n") }
	for _, name := range []string{"randAlphaNum", "randAlpha", "randNumeric", "randAscii", "randBytes"} {
		f[name] = boundCount(name, reflect.ValueOf(f[name]))
	}
	f["replace"] = func(old, repl, src string) (string, error) {
		if err := checkSize("replace", replaceBound(len(src), len(old), len(repl))); err != nil {
			return "", err
		}
		return strings.ReplaceAll(src, old, repl), nil
	}
	f["wrapWith"] = func(l int, sep, s string) (string, error) {
		if err := checkSize("wrapWith", replaceBound(len(s), max(l, 1), len(sep))); err != nil {
			return "", err
		}
		return sprig.TxtFuncMap()["wrapWith"].(func(int, string, string) string)(l, sep, s), nil
	}
	f["join"] = func(sep string, v any) (string, error) {
		n, ok := measure(v, maxValueBytes)
		if !ok {
			return "", valueLimitError("join's list")
		}
		count := 0
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice || rv.Kind() == reflect.Array {
			count = rv.Len()
		}
		if err := checkSize("join", int64(n)+int64(count)*int64(len(sep))); err != nil {
			return "", err
		}
		return sprig.TxtFuncMap()["join"].(func(string, any) string)(sep, v), nil
	}
	// Regular expressions and the pairwise list functions cost the product
	// of their inputs in one call (see maxCallWork). The non-must variants
	// panic on an error, as sprig's do.
	f["mustRegexMatch"] = func(re, s string) (bool, error) { return boundRegexMatch(st, re, s) }
	f["regexMatch"] = func(re, s string) bool { return must(boundRegexMatch(st, re, s)) }
	f["mustRegexFind"] = func(re, s string) (string, error) { return boundRegexFind(st, re, s) }
	f["regexFind"] = func(re, s string) string { return must(boundRegexFind(st, re, s)) }
	f["mustRegexFindAll"] = func(re, s string, n int) ([]string, error) { return boundRegexFindAll(st, re, s, n) }
	f["regexFindAll"] = func(re, s string, n int) []string { return must(boundRegexFindAll(st, re, s, n)) }
	f["mustRegexSplit"] = func(re, s string, n int) ([]string, error) { return boundRegexSplit(st, re, s, n) }
	f["regexSplit"] = func(re, s string, n int) []string { return must(boundRegexSplit(st, re, s, n)) }
	f["mustRegexReplaceAll"] = func(re, s, repl string) (string, error) { return boundRegexReplace(st, re, s, repl, false) }
	f["regexReplaceAll"] = func(re, s, repl string) string { return must(boundRegexReplace(st, re, s, repl, false)) }
	f["mustRegexReplaceAllLiteral"] = func(re, s, repl string) (string, error) { return boundRegexReplace(st, re, s, repl, true) }
	f["regexReplaceAllLiteral"] = func(re, s, repl string) string { return must(boundRegexReplace(st, re, s, repl, true)) }
	for _, name := range []string{"uniq", "mustUniq"} {
		generic := reflect.ValueOf(f[name]) // boundGeneric's wrapper
		f[name] = reflect.MakeFunc(generic.Type(), func(args []reflect.Value) []reflect.Value {
			if err := checkPairs(name, args[0].Interface(), args[0].Interface()); err != nil {
				panic(err)
			}
			return generic.Call(args)
		}).Interface()
	}
	for _, name := range []string{"without", "mustWithout"} {
		generic := reflect.ValueOf(f[name])
		f[name] = reflect.MakeFunc(generic.Type(), func(args []reflect.Value) []reflect.Value {
			// The omitted values come as one slice (MakeFunc of a variadic).
			if err := checkPairs(name, args[0].Interface(), args[1].Interface()); err != nil {
				panic(err)
			}
			return generic.CallSlice(args)
		}).Interface()
	}

	f["quote"] = boundQuote
	f["squote"] = boundQuote
	f["toJSON"] = boundToJSON
	f["toJson"] = boundToJSON
	f["toYAML"] = boundToYAML
	f["toYaml"] = boundToYAML
	f["annotation"] = annotation
	f["label"] = label
	f["valueOrDefault"] = valueOrDefault
	f["podName"] = podName
	f["isset"] = isset

	f[stepFunc] = func() (string, error) { return "", st.step() }
	f[outFunc] = printOut
	return f
}

// checkSize fails when a function's output would pass maxValueBytes.
func checkSize(name string, n int64) error {
	if n < 0 || n > maxValueBytes {
		return valueLimitError(name + "'s result")
	}
	return nil
}

// boundGeneric wraps fn: each call is a step, its arguments together and
// each result must measure within maxValueBytes. A limit panics with a
// *limitError, which text/template turns into "error calling NAME: ...".
func boundGeneric(st *renderState, name string, fn any) any {
	fv := reflect.ValueOf(fn)
	ft := fv.Type()
	return reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
		if err := st.step(); err != nil {
			panic(err)
		}
		n := 0
		for _, a := range args {
			if !measureInto(a.Interface(), 0, &n, maxValueBytes) {
				panic(valueLimitError(name + "'s arguments"))
			}
		}
		var out []reflect.Value
		if ft.IsVariadic() {
			out = fv.CallSlice(args)
		} else {
			out = fv.Call(args)
		}
		if len(out) > 0 && out[0].IsValid() && out[0].CanInterface() {
			if _, ok := measure(out[0].Interface(), maxValueBytes); !ok {
				panic(valueLimitError(name + "'s result"))
			}
		}
		return out
	}).Interface()
}

// boundCount wraps the rand* functions (already wrapped by boundGeneric),
// whose output has COUNT bytes (4/3 as many for randBytes' base64): the
// count is checked before anything is allocated.
func boundCount(name string, generic reflect.Value) any {
	return func(count int) (string, error) {
		if err := checkSize(name, int64(count)*4/3); err != nil {
			return "", err
		}
		out := generic.Call([]reflect.Value{reflect.ValueOf(count)})
		if len(out) == 2 && !out[1].IsNil() {
			return "", out[1].Interface().(error)
		}
		return out[0].String(), nil
	}
}

// boundUntilStep is sprig's untilStep with its element count checked first
// and computed without overflow (sprig's loop wraps around near MaxInt).
func boundUntilStep(start, stop, step int) ([]int, error) {
	var diff, abs uint64 // exact in uint64 even when stop-start overflows int
	switch {
	case step > 0 && stop > start:
		diff, abs = uint64(stop)-uint64(start), uint64(step)
	case step < 0 && stop < start:
		diff, abs = uint64(start)-uint64(stop), -uint64(step)
	}
	var count uint64
	if abs > 0 {
		count = diff / abs
		if diff%abs != 0 {
			count++
		}
	}
	if count > maxValueBytes/16 {
		return nil, valueLimitError(fmt.Sprintf("a list of %d numbers", count))
	}
	v := make([]int, 0, count)
	for i := uint64(0); i < count; i++ {
		v = append(v, start+int(i)*step)
	}
	return v, nil
}

// boundSeq is sprig's seq (1, 2 or 3 arguments like GNU seq) on boundUntilStep.
func boundSeq(params ...int) (string, error) {
	var start, step, end int
	switch len(params) {
	case 1:
		start, step, end = 1, 1, params[0]
	case 2:
		start, step, end = params[0], 1, params[1]
	case 3:
		start, step, end = params[0], params[1], params[2]
		if end < start && step > 0 {
			return "", nil
		}
	default:
		return "", nil
	}
	if len(params) < 3 && end < start {
		step = -1
	}
	inc := 1
	if end < start {
		inc = -1
	}
	if (inc > 0 && end == math.MaxInt) || (inc < 0 && end == math.MinInt) {
		return "", valueLimitError("seq's range")
	}
	v, err := boundUntilStep(start, end+inc, step)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i, x := range v {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(x))
	}
	return b.String(), nil
}

func boundIndent(name string, n int, s, prefix string) (string, error) {
	if n < 0 {
		return "", fmt.Errorf("%s: negative width %d", name, n)
	}
	lines := int64(strings.Count(s, "\n") + 1)
	if err := checkSize(name, int64(len(s))+lines*int64(n)); err != nil {
		return "", err
	}
	pad := strings.Repeat(" ", n)
	return prefix + pad + strings.ReplaceAll(s, "\n", "\n"+pad), nil
}

// replaceBound is the largest output of replacing every OLD-long match in
// an N-long string with a REPL-long one; an empty OLD matches between every
// byte.
func replaceBound(n, old, repl int) int64 {
	matches := int64(n) + 1
	if old > 0 {
		matches = int64(n/old) + 1
	}
	return int64(n) + matches*int64(repl)
}

// Regex replacement bounds: the match indexes FindAll returns are held at
// once, so their number and width are capped as well as the output.
const (
	maxRegexMatches = 16384
	maxRegexGroups  = 64
)

// must returns v, panicking on err as sprig's non-must functions do;
// text/template reports the panic as the call's error.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// boundSprint measures the arguments before fmt expands them.
func boundSprint(f func(...any) string, args []any) (string, error) {
	n := 0
	for _, a := range args {
		if !measureInto(a, 0, &n, maxValueBytes) {
			return "", valueLimitError("print's arguments")
		}
	}
	return f(args...), nil
}

// boundPrintf checks what fmt can make of the format before it runs: fmt
// caps each width and precision at 1e6 (BADWIDTH beyond), but applies them
// to every element of a list and allows one per verb. Like boundQuote it
// has one result and panics on a limit.
func boundPrintf(format string, args ...any) string {
	n := 0
	for _, a := range args {
		if !measureInto(a, 0, &n, maxValueBytes) {
			panic(valueLimitError("printf's arguments"))
		}
	}
	widths, maxWidth := int64(0), int64(0)
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		// Flags, argument indexes, width and precision up to the verb;
		// digits inside [n] count as a width, which only overestimates.
		for i++; i < len(format); {
			c := format[i]
			w := int64(-1)
			switch {
			case c == '*':
				w = 1_000_000
				i++
			case c >= '0' && c <= '9':
				j := i
				for j < len(format) && format[j] >= '0' && format[j] <= '9' {
					j++
				}
				w, _ = strconv.ParseInt(format[i:j], 10, 64)
				if w > 1_000_000 || w < 0 {
					w = 0 // fmt prints %!(BADWIDTH) and ignores it
				}
				i = j
			case strings.IndexByte("+-# .[]", c) >= 0:
				i++
				continue
			}
			if w < 0 {
				break // the verb
			}
			widths += w
			maxWidth = max(maxWidth, w)
		}
	}
	if err := checkSize("printf", int64(len(format))+widths+int64(n)*(maxWidth+1)); err != nil {
		panic(err)
	}
	return fmt.Sprintf(format, args...)
}

// boundQuote returns one result, as quoteAll does: a second (error) result
// costs text/template an allocation per call. A limit panics, which
// text/template reports as the call's error.
func boundQuote(args ...any) string {
	n := 0
	for _, a := range args {
		if !measureInto(a, 0, &n, maxValueBytes) {
			panic(valueLimitError("quote's arguments"))
		}
	}
	s := quoteAll(args...)
	if len(s) > maxValueBytes {
		panic(valueLimitError("quote's result"))
	}
	return s
}

func boundToJSON(v any) (string, error) {
	if err := checkValue("toJSON's argument", v); err != nil {
		return "", err
	}
	return toJSON(v)
}

func boundToYAML(v any) (string, error) {
	if err := checkValue("toYAML's argument", v); err != nil {
		return "", err
	}
	return toYAML(v)
}
