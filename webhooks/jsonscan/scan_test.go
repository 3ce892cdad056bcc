package jsonscan

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

func TestUnescapeMatchesEncodingJSON(t *testing.T) {
	inputs := []string{
		`plain`, `q\"uote`, `back\\slash`, `sl\/ash`, `\b\f\n\r\t`, `\u00e9t\u00E9`, `\ud83d\ude00`,
		`lone \ud83d high`, `lone \ude00 low`, `\ud83d\u0041`, "ünï", "bad\xffutf8",
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 2000; i++ {
		b := make([]rune, rng.IntN(12))
		for j := range b {
			b[j] = rune(rng.IntN(0x1_0000))
		}
		enc, _ := json.Marshal(string(b))
		inputs = append(inputs, string(enc[1:len(enc)-1]))
	}
	for _, in := range inputs {
		var want string
		if err := json.Unmarshal([]byte(`"`+in+`"`), &want); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		got, ok := unescape([]byte(in))
		if !ok || got != want {
			t.Fatalf("Unescape(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, bad := range []string{`\x`, `\u12`, `\u12g4`, "ctl\x01", `end\`} {
		if _, ok := unescape([]byte(bad)); ok {
			t.Errorf("Unescape(%q) accepted", bad)
		}
	}
}

func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote\back`, "ctl\x00\x01\x1f\n\r\t", "ünï", "bad\xffutf8", "<&>"} {
		var back string
		if err := json.Unmarshal(AppendString(nil, s), &back); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		want, _ := json.Marshal(s)
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Errorf("%q round-trips to %q, want %q", s, back, wantBack)
		}
	}
}
