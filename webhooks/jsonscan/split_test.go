package jsonscan

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

// NamedArray's names are what encoding/json reads as each element's name.
func TestNamedArrayMatchesEncodingJSON(t *testing.T) {
	for _, d := range []string{
		`[]`, `null`, ` [ {"name":"a"} , {"image":"x"}, null, {"name":"b","name":"c"}, {"na\u006de":"d"}, {"name":1} ] `,
		`[{"name":"pro\u0078y","env":[{"name":"inner"}]}]`, "[{\"name\":\"\\ud83d\\ude00 bad\xff\"}]",
	} {
		var want []*struct{ Name any }
		if err := json.Unmarshal([]byte(d), &want); err != nil {
			t.Fatal(d, err)
		}
		elems, names, err := NamedArray([]byte(d))
		if err != nil || len(elems) != len(want) || len(names) != len(want) {
			t.Fatalf("%s: %d elements %q, %v; want %d", d, len(elems), names, err, len(want))
		}
		for i, w := range want {
			s := ""
			if w != nil {
				s, _ = w.Name.(string)
			}
			if names[i] != s {
				t.Errorf("%s: name %d = %q, want %q", d, i, names[i], s)
			}
			if !json.Valid(elems[i]) {
				t.Errorf("%s: element %d %q is not JSON", d, i, elems[i])
			}
		}
	}
	for _, d := range []string{`[1]`, `["x"]`, `{}`, `[{"name":"a"}`, `[{"name":"a"}] x`, `[{"name":"\q"}]`} {
		if _, _, err := NamedArray([]byte(d)); err == nil {
			t.Errorf("NamedArray(%q) accepted", d)
		}
	}
	var te *TypeError
	if _, _, err := NamedArray([]byte(`[{"name":"a"},5]`)); !errors.As(err, &te) {
		t.Errorf("non-object element: %v, want a *TypeError", err)
	}
}

func TestReadStrings(t *testing.T) {
	for in, want := range map[string][]string{`null`: nil, `[]`: nil, `["a","b\n"]`: {"a", "b\n"}} {
		got, end, err := ReadStrings([]byte(in), 0, "f")
		if err != nil || end != len(in) || !slices.Equal(got, want) {
			t.Errorf("ReadStrings(%s) = %q %d %v", in, got, end, err)
		}
	}
	if _, _, err := ReadStrings([]byte(`[1]`), 0, "f"); err == nil {
		t.Error("[1] accepted")
	}
}
