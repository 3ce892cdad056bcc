package sidecar

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/hookwright/hookwright/webhooks/jsonscan"
)

func TestSplitMatchesEncodingJSON(t *testing.T) {
	docs := []string{
		`{}`, ` { "a" : 1 , "b":[1,2,{"c":"d"}], "e\"q":"x\\y}]", "n":null, "t":true, "f":-1.5e3 } `,
		`{"k":"\u00e9\\\"","nested":{"a":{"b":[[],[{}]]}}}`,
		nginxPod, string(manyEnvPod(10)),
	}
	for _, d := range docs {
		var want map[string]json.RawMessage
		if err := json.Unmarshal([]byte(d), &want); err != nil {
			t.Fatal(err)
		}
		got, err := jsonscan.Object([]byte(d))
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d members, want %d", d, len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Errorf("%s: member %q = %s, want %s", d, k, got[k], v)
			}
		}
	}
	arr := `[ 1, "a,]", {"x":[1]} ,null,[ ] ]`
	var want []json.RawMessage
	_ = json.Unmarshal([]byte(arr), &want)
	got, err := jsonscan.Array([]byte(arr))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("jsonscan.Array = %q, %v; want %q", got, err, want)
	}
	if _, n, err := jsonscan.NamedArray([]byte(`[{"image":"x","name":"pro\u0078y"}]`)); err != nil || len(n) != 1 || n[0] != "proxy" {
		t.Errorf("NamedArray names = %q %v", n, err)
	}
}

func TestSplitRejectsDamage(t *testing.T) {
	for _, d := range []string{``, `{`, `{"a"`, `{"a":`, `{"a":1`, `{"a" 1}`, `{"a":1 "b":2}`, `{"a":"unterminated}`, `{a:1}`, `[1,2`, `{"a":[1,2}`, `{"a":}`} {
		if _, err := jsonscan.Object([]byte(d)); err == nil {
			t.Errorf("jsonscan.Object(%q) accepted", d)
		}
	}
	for _, d := range []string{`[`, `[1`, `[1 2]`, `{}`, `["x]`} {
		if _, err := jsonscan.Array([]byte(d)); err == nil {
			t.Errorf("jsonscan.Array(%q) accepted", d)
		}
	}
}

// FuzzSplitObject: the splitter never panics, and on valid JSON objects it
// agrees with encoding/json.
func FuzzSplitObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, nginxPod, `{"a":"\\"}`, `{"a":[{"b":"]"}]}`, `{`, `{"a":"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := jsonscan.Object([]byte(s))
		var want map[string]json.RawMessage
		if json.Unmarshal([]byte(s), &want) != nil || want == nil {
			return
		}
		if err != nil {
			t.Fatalf("valid %q rejected: %v", s, err)
		}
		for k, v := range want {
			if !bytes.Equal(bytes.TrimSpace(got[k]), v) {
				t.Fatalf("%q: member %q = %q, want %q", s, k, got[k], v)
			}
		}
	})
}
