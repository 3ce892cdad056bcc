package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const fuzzMarker = "zqmarkerqz"

// fuzzData puts s in every pod-controlled string the sample templates read.
func fuzzData(cfg *Config, s string, native bool) *templateData {
	return &templateData{
		ObjectMeta: &metav1.ObjectMeta{
			Name:         s,
			GenerateName: s,
			Labels:       map[string]string{"app": s, "version": s},
			Annotations: map[string]string{
				"proxy.hookwright.io/log-level":             s,
				"proxy.hookwright.io/exclude-inbound-ports": s,
				"logging.hookwright.io/format":              s,
			},
		},
		Spec:           &corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		Namespace:      s,
		Values:         deepCopyValue(cfg.values).(map[string]any),
		Injector:       cfg.Name,
		NativeSidecars: native,
	}
}

// FuzzSampleTemplates renders the shipped sample templates with an arbitrary
// string in every pod-controlled field and checks the result has exactly the
// structure it has for a harmless marker, with the marker replaced by the
// string: pod data can only ever become a string value, never YAML structure.
func FuzzSampleTemplates(f *testing.F) {
	for _, s := range []string{
		"plain", "a\nb: c", "x\"\n  injected: true\n\"", "}{", "{a: b}", "[1, 2]", "key: value",
		"- item", "# comment", "&anchor", "*alias", "!!binary AAAA", "'single'", "\"double\"",
		"yes", "null", "~", "0x1F", "1e3", "\t\ttabs", "trailing\\", "\\\"", "\x00nul", "\x7fdel",
		"\u0085nel", "line\u2028sep", "para\u2029sep", "\ufeffbom", "\uffff", "\xff\xfe invalid",
		"emoji 😀", "a\r\nb", "${ENV}", "{{ .Values }}", "%TAG ! tag:", "---\nkind: Secret", "...",
	} {
		f.Add(s)
	}
	cfg := sampleConfig(f)
	f.Fuzz(func(t *testing.T, s string) {
		// Pod strings arrive as JSON, so they are valid UTF-8.
		s = strings.ToValidUTF8(s, "\ufffd")
		if s == "" {
			return // empty values select the templates' defaults
		}
		for _, native := range []bool{false, true} {
			for _, name := range []string{"proxy", "logging"} {
				tm := cfg.templates[name]
				wantPart, err := cfg.renderOne(context.Background(), tm, fuzzData(cfg, fuzzMarker, native))
				if err != nil {
					t.Fatal(err)
				}
				gotPart, err := cfg.renderOne(context.Background(), tm, fuzzData(cfg, s, native))
				if err != nil {
					t.Fatalf("template %s with %q: %v", name, s, err)
				}
				want, got := wantPart.json, gotPart.json
				var w, g any
				if err := json.Unmarshal(want, &w); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(got, &g); err != nil {
					t.Fatal(err)
				}
				if err := sameShape(w, g, s, name); err != nil {
					t.Fatalf("template %s, value %q: %v", name, s, err)
				}
			}
		}
		// The whole engine takes it too.
		pod, _ := json.Marshal(map[string]any{
			"metadata": fuzzData(cfg, s, false).ObjectMeta,
			"spec":     map[string]any{"containers": []any{map[string]any{"name": "app", "image": "app"}}},
		})
		if _, err := Inject(cfg, testParams, Input{Raw: pod, Namespace: "shop", WantPatch: true}); err != nil {
			t.Fatalf("inject with %q: %v", s, err)
		}
	})
}

// sameShape checks that got is want with fuzzMarker replaced by s.
func sameShape(want, got any, s, path string) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: structure changed: %v", path, got)
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s: key %q missing, got keys %v", path, k, reflect.ValueOf(g).MapKeys())
			}
			if err := sameShape(wv, gv, s, path+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: list changed: %v", path, got)
		}
		for i := range w {
			if err := sameShape(w[i], g[i], s, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	case string:
		exp := strings.ReplaceAll(w, fuzzMarker, s)
		if g, ok := got.(string); !ok || g != exp {
			return fmt.Errorf("%s: got %#v, want %q", path, got, exp)
		}
		return nil
	}
	if !reflect.DeepEqual(want, got) {
		return fmt.Errorf("%s: got %#v, want %#v", path, got, want)
	}
	return nil
}

// TestQuote checks the quote helper round-trips through the YAML parser the
// engine uses, for every rune class it treats specially.
func TestQuote(t *testing.T) {
	for _, s := range []string{"", "a", `"`, `\`, "\n", "\x00", "\x7f", "\u0085", "\u2028", "\ufeff", "\ufffe", "\uffff", "😀", "é", "a: b\n- c"} {
		j, err := yaml.YAMLToJSONStrict([]byte("v: " + quote(s)))
		if err != nil {
			t.Fatalf("Quote(%q) = %s: %v", s, quote(s), err)
		}
		var m map[string]string
		if err := json.Unmarshal(j, &m); err != nil || m["v"] != s {
			t.Errorf("Quote(%q) = %s parsed back as %q (%v)", s, quote(s), m["v"], err)
		}
		var js string
		if err := json.Unmarshal([]byte(quote(s)), &js); err != nil || js != s {
			t.Errorf("Quote(%q) is not the same JSON string: %q %v", s, js, err)
		}
	}
	if got := quoteAll("a", 1, nil, "b c"); got != `"a" "1" "b c"` {
		t.Errorf("quoteAll = %s", got)
	}
	out, err := toJSON(map[string]any{"k\u2028": "v\x7f\ufeff<>"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := yaml.YAMLToJSONStrict([]byte("v: " + out)); err != nil {
		t.Errorf("toJSON output %s is not YAML: %v", out, err)
	}
}
