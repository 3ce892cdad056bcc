package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/template"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// FuncMap returns the functions available to templates: sprig's TxtFuncMap
// plus the helpers below, every one bounded (see maxValueBytes). Removed:
// sprig's env/expandenv (would leak the server's environment into pods),
// getHostByName (DNS at admission time), and the functions that cost up to
// seconds of CPU per call by design and would put fresh key material into a
// pod spec stored in etcd: genPrivateKey, genCA, genCAWithKey,
// genSelfSignedCert, genSelfSignedCertWithKey, genSignedCert,
// genSignedCertWithKey, buildCustomCert, derivePassword (scrypt, 32 MiB a
// call), bcrypt and htpasswd. quote and squote are replaced by a YAML-safe
// quote: sprig's versions emit Go-quoted or unescaped single-quoted strings,
// which a value containing a quote or a line break can break out of.
//
// Helpers:
//
//	quote V...                      each V as a double-quoted YAML/JSON string, space separated
//	toJSON V / toJson V             V as single-line JSON (valid YAML flow), YAML-safe
//	toYAML V / toYaml V             V as block YAML (use with nindent)
//	annotation META KEY DEFAULT     META.Annotations[KEY], or DEFAULT when absent or empty
//	label META KEY DEFAULT          META.Labels[KEY], or DEFAULT when absent or empty
//	valueOrDefault V DEFAULT        V unless it is empty (sprig's empty), else DEFAULT
//	podName META                    META.Name, or META.GenerateName when the name is empty
//	isset MAP KEY                   whether MAP has KEY
//
// Values that come from the pod (annotations, labels, names) are pod-author
// controlled: pass them through quote or toJSON so they can only ever be a
// string value, never YAML structure.
//
// The functions returned here are bound to no render: they enforce the
// size limits but count no steps. The engine binds its own copy to each
// render's budget.
func FuncMap() template.FuncMap { return funcMap(nil) }

// quote returns s as a double-quoted scalar that YAML 1.1/1.2 and JSON parse
// back to exactly s. Besides `"` and `\`, it escapes every rune YAML does not
// allow raw in a stream (C0/C1 controls, DEL, U+FEFF, U+FFFE, U+FFFF) and the
// YAML 1.1 line breaks U+0085, U+2028, U+2029, which would otherwise be folded.
// Invalid UTF-8 bytes become U+FFFD, as encoding/json does.
func quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if needsEscape(r) || (r == utf8.RuneError && size == 1) {
			if r == utf8.RuneError {
				r = 0xfffd
			}
			fmt.Fprintf(&b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

func needsEscape(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f:
		return true
	case r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x2028, r == 0x2029, r == 0xfeff, r == 0xfffe, r == 0xffff:
		return true
	}
	return false
}

func quoteAll(args ...any) string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		if a == nil {
			continue
		}
		var s string
		switch v := a.(type) {
		case string:
			s = v
		case fmt.Stringer:
			s = v.String()
		default:
			s = fmt.Sprint(v)
		}
		out = append(out, quote(s))
	}
	return strings.Join(out, " ")
}

// toJSON marshals v as compact JSON. encoding/json leaves DEL, C1 controls and
// U+FEFF/U+FFFE/U+FFFF raw, which YAML rejects; those only occur inside JSON
// strings, so they are escaped in place.
func toJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	if bytes.IndexFunc(b, needsEscape) < 0 {
		return string(b), nil
	}
	var out strings.Builder
	for _, r := range string(b) {
		if needsEscape(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
			continue
		}
		out.WriteRune(r)
	}
	return out.String(), nil
}

func toYAML(v any) (string, error) {
	b, err := yaml.Marshal(v)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

func metaOf(m any) *metav1.ObjectMeta {
	switch v := m.(type) {
	case *metav1.ObjectMeta:
		return v
	case metav1.ObjectMeta:
		return &v
	}
	return nil
}

func annotation(meta any, key string, def any) any {
	if m := metaOf(meta); m != nil {
		if v, ok := m.Annotations[key]; ok && v != "" {
			return v
		}
	}
	return def
}

func label(meta any, key string, def any) any {
	if m := metaOf(meta); m != nil {
		if v, ok := m.Labels[key]; ok && v != "" {
			return v
		}
	}
	return def
}

func valueOrDefault(v, def any) any {
	if isEmpty(v) {
		return def
	}
	return v
}

func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	case json.Number:
		return x == "0" || x == ""
	case int:
		return x == 0
	case int64:
		return x == 0
	case float64:
		return x == 0
	}
	return false
}

func podName(meta any) string {
	if m := metaOf(meta); m != nil {
		if m.Name != "" {
			return m.Name
		}
		return m.GenerateName
	}
	return ""
}

func isset(m map[string]any, key string) bool {
	_, ok := m[key]
	return ok
}
