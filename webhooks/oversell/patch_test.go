package oversell

import (
	"encoding/json"
	"maps"
	"reflect"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
)

// nodeDoc renders a NodeState as the JSON of a Node.
func nodeDoc(t testing.TB, n NodeState) []byte {
	t.Helper()
	var doc nodeJSON
	doc.Metadata.Name = "n1"
	doc.Metadata.Labels = n.Labels
	doc.Metadata.Annotations = n.Annotations
	doc.Status.Capacity = n.Capacity
	doc.Status.Allocatable = n.Allocatable
	b, err := json.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// applyDecision runs decide's output through appendPatch and a real JSON
// patch implementation, returning the resulting node.
func applyDecision(t testing.TB, obj NodeState, d Decision) (NodeState, []byte) {
	t.Helper()
	patch, ok := appendPatch(nil, obj, d)
	if !ok {
		return obj, nil
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("invalid patch %s: %v", patch, err)
	}
	out, err := p.Apply(nodeDoc(t, obj))
	if err != nil {
		t.Fatalf("applying %s: %v", patch, err)
	}
	var n nodeJSON
	if err := json.Unmarshal(out, &n); err != nil {
		t.Fatal(err)
	}
	return n.state(), patch
}

func TestAppendPatch(t *testing.T) {
	pool := policy("oversell-pool", "2", "1.5")
	plain := node("3800m", "15Gi", map[string]string{"other": "kept"})
	amplified := node("7600m", "23040Mi", amplifiedAnn())

	t.Run("first amplification", func(t *testing.T) {
		got, patch := applyDecision(t, plain, Decide(Input{Writer: writerKubelet, Object: plain, Old: &plain, Policy: pool}))
		want := node("7600m", "23040Mi", amplifiedAnn())
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v\nwant %+v", got, want)
		}
		const wantPatch = `[{"op":"replace","path":"/status/allocatable/cpu","value":"7600m"},` +
			`{"op":"replace","path":"/status/allocatable/memory","value":"23040Mi"},` +
			`{"op":"add","path":"/metadata/annotations/oversell.hookwright.io~1raw-allocatable","value":"{\"cpu\":\"3800m\",\"memory\":\"15Gi\"}"},` +
			`{"op":"add","path":"/metadata/annotations/oversell.hookwright.io~1ratios","value":"{\"cpu\":\"2\",\"memory\":\"1.5\"}"},` +
			`{"op":"add","path":"/metadata/annotations/oversell.hookwright.io~1applied-by","value":"oversell-pool"}]`
		if string(patch) != wantPatch {
			t.Fatalf("patch\n%s\nwant\n%s", patch, wantPatch)
		}
	})

	t.Run("no annotations map", func(t *testing.T) {
		bare := node("3800m", "15Gi", nil)
		got, _ := applyDecision(t, bare, Decide(Input{Writer: writerKubelet, Object: bare, Old: &bare, Policy: pool}))
		want := node("7600m", "23040Mi", with(amplifiedAnn(), "other", "-"))
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v\nwant %+v", got, want)
		}
	})

	t.Run("heartbeat only touches allocatable", func(t *testing.T) {
		in := node("3800m", "15Gi", amplifiedAnn())
		got, patch := applyDecision(t, in, Decide(Input{Writer: writerKubelet, Object: in, Old: &amplified, Policy: pool}))
		if !reflect.DeepEqual(got, amplified) {
			t.Fatalf("got %+v", got)
		}
		const wantPatch = `[{"op":"replace","path":"/status/allocatable/cpu","value":"7600m"},{"op":"replace","path":"/status/allocatable/memory","value":"23040Mi"}]`
		if string(patch) != wantPatch {
			t.Fatalf("patch %s", patch)
		}
	})

	t.Run("steady state carries no patch", func(t *testing.T) {
		// "7.6" equals "7600m": no rewrite for a different spelling.
		in := node("7.6", "23040Mi", amplifiedAnn())
		if patch, ok := appendPatch(nil, in, Decide(Input{Writer: WriterOther, Object: in, Old: &amplified, Policy: pool})); ok {
			t.Fatalf("unexpected patch %s", patch)
		}
	})

	t.Run("deselection removes annotations and restores raw", func(t *testing.T) {
		got, _ := applyDecision(t, amplified, Decide(Input{Writer: WriterOther, Object: amplified, Old: &amplified}))
		if !reflect.DeepEqual(got, plain) {
			t.Fatalf("got %+v\nwant %+v", got, plain)
		}
	})

	t.Run("other resources untouched", func(t *testing.T) {
		got, _ := applyDecision(t, plain, Decide(Input{Writer: writerKubelet, Object: plain, Old: &plain, Policy: pool}))
		for _, k := range []string{"pods", "ephemeral-storage", "hugepages-2Mi"} {
			if got.Allocatable[k] != plain.Allocatable[k] || got.Capacity[k] != plain.Capacity[k] {
				t.Errorf("%s changed", k)
			}
		}
		if !maps.Equal(got.Capacity, plain.Capacity) {
			t.Errorf("capacity changed: %v", got.Capacity)
		}
	})

	t.Run("no decision, no patch", func(t *testing.T) {
		if patch, ok := appendPatch([]byte("x"), plain, Decision{Reason: reasonRawUnknown}); ok || string(patch) != "x" {
			t.Fatalf("got %q %v", patch, ok)
		}
	})
}

func TestAnnotationPath(t *testing.T) {
	if got := annotationPath("a/b~c"); got != "/metadata/annotations/a~1b~0c" {
		t.Fatal(got)
	}
}
