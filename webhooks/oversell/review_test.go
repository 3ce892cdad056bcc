package oversell

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/hookwright/hookwright/webhooks/jsonscan"
)

// parseReview agrees with encoding/json on the fields it reads.
func TestParseReviewMatchesEncodingJSON(t *testing.T) {
	obj := realisticNode("n1", "7600m", "30Gi", map[string]string{"odd/\"key\"": "v\u00e9\n", annRaw: `{"cpu":"1"}`})
	old := realisticNode("n1", "15200m", "45Gi", nil)
	body := reviewFor(t, "system:node:n1", kubeletGroups, obj, old)
	got, nodeErr, err := parseReview(body)
	if err != nil || nodeErr != nil {
		t.Fatal(err, nodeErr)
	}
	var want struct {
		APIVersion string      `json:"apiVersion"`
		Kind       string      `json:"kind"`
		Request    requestJSON `json:"request"`
	}
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatal(err)
	}
	// The hold check's record has no encoding/json counterpart.
	if !got.req.Object.scan.ok || len(got.req.Object.scan.conds) != 5 || got.req.OldObject == nil || !got.req.OldObject.scan.ok {
		t.Fatalf("hold record missing: object %+v", got.req.Object.scan.conds)
	}
	got.req.Object.scan, got.req.OldObject.scan = nodeScan{}, nodeScan{}
	if got.apiVersion != want.APIVersion || got.kind != want.Kind || !reflect.DeepEqual(*got.req, want.Request) {
		t.Fatalf("got %+v\nwant %+v", *got.req, want.Request)
	}
}

func TestParseReviewErrors(t *testing.T) {
	obj := realisticNode("n1", "7600m", "30Gi", nil)
	good := string(reviewFor(t, "system:node:n1", kubeletGroups, obj, obj))
	syntax := map[string]string{
		"empty":            "",
		"garbage":          "hello",
		"truncated":        good[:len(good)-3],
		"trailing":         good + "x",
		"two values":       good + " {}",
		"unterminated str": `{"apiVersion":"admission.k8s.io/v1`,
		"mismatched":       `{"apiVersion":"v1","request":{"object":{"status":{"images":[}]}}}`,
		"missing colon":    `{"apiVersion" "v1"}`,
		"bad literal":      `{"request":{"dryRun":nope}}`,
		"control in used":  "{\"apiVersion\":\"a\x01\"}",
		// Invalid tokens in skipped members (the tester's repro first).
		"bad number":        `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":1-2-3e+e,"request":{"uid":"u"}}`,
		"leading zero":      `{"x":01,"request":{"uid":"u"}}`,
		"bare minus":        `{"x":-,"request":{"uid":"u"}}`,
		"dot without digit": `{"x":1.,"request":{"uid":"u"}}`,
		"bad escape":        `{"x":"\q","request":{"uid":"u"}}`,
		"control skipped":   "{\"x\":\"a\x01\",\"request\":{\"uid\":\"u\"}}",
		"bad nested":        `{"x":{"a":[1,,2]},"request":{"uid":"u"}}`,
		"deep mismatch":     `{"x":` + strings.Repeat("[", 70) + strings.Repeat("}", 70) + `}`,
		"bad in object":     strings.Replace(good, `"kubeletEndpoint":{"Port":10250}`, `"kubeletEndpoint":{"Port":1e}`, 1),
	}
	for name, in := range syntax {
		if _, _, err := parseReview([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Wrong shapes in the envelope are errors; inside a node they are nodeErr.
	if _, _, err := parseReview([]byte(`{"request":{"uid":5}}`)); err == nil {
		t.Error("numeric uid accepted")
	}
	body := strings.Replace(good, `"labels":{`, `"labels":[1],"x":{`, 1)
	rv, nodeErr, err := parseReview([]byte(body))
	if err != nil || nodeErr == nil || rv.req.UID == "" {
		t.Fatalf("err %v nodeErr %v", err, nodeErr)
	}
	// null object (DELETE-like) and null oldObject decode to empty / nil.
	rv, nodeErr, err = parseReview([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":null,"oldObject":null,"userInfo":{"groups":null}}}`))
	if err != nil || nodeErr != nil || rv.req.OldObject != nil {
		t.Fatalf("null objects: %v %v %+v", err, nodeErr, rv.req)
	}
}

// checkAgreesWithValid: parseReview fails (400) on every body encoding/json
// finds invalid, and reports a syntax error on no valid one. A wrong type in
// the envelope may be reported before a later syntax error.
func checkAgreesWithValid(t *testing.T, b []byte) {
	t.Helper()
	_, _, err := parseReview(b)
	_, isSyntax := err.(*jsonscan.SyntaxError)
	if valid := json.Valid(b); (valid && isSyntax) || (!valid && err == nil) {
		t.Fatalf("json.Valid %v, parseReview error %v, for %q", valid, err, b)
	}
}

// Single-byte corruptions anywhere in a review, skipped parts included,
// are rejected exactly when the JSON is invalid.
func TestParseReviewValidatesSkippedValues(t *testing.T) {
	obj := realisticNode("n1", "7600m", "30Gi", map[string]string{annRaw: `{"cpu":"3800m"}`})
	obj.Status.Images = obj.Status.Images[:3]
	good := reviewFor(t, "system:node:n1", kubeletGroups, obj, obj)
	checkAgreesWithValid(t, good)
	alphabet := []byte("0123456789-+.eE\"\\/{}[],: \t\ntrufalsenbx\x01\x7f\xc3")
	rng := rand.New(rand.NewPCG(3, 3))
	for n := 0; n < 5000; n++ {
		b := bytes.Clone(good)
		for k := 1 + rng.IntN(2); k > 0; k-- {
			b[rng.IntN(len(b))] = alphabet[rng.IntN(len(alphabet))]
		}
		checkAgreesWithValid(t, b)
	}
}

// FuzzParseReview: no input panics or loops. Run with -fuzzminimizetime 1s;
// minimising multi-KB inputs otherwise stalls the fuzzer.
func FuzzParseReview(f *testing.F) {
	// A compact node (no images or managedFields) keeps executions fast.
	obj := realisticNode("n1", "7600m", "30Gi", map[string]string{annRaw: `{"cpu":"3800m"}`})
	obj.Status.Images, obj.ManagedFields = nil, nil
	f.Add(reviewFor(f, "system:node:n1", kubeletGroups, obj, obj))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"\u0075","userInfo":{"groups":["a","b"]}}}`))
	f.Add([]byte(`[{"a":"\"}"}]`))
	f.Fuzz(func(t *testing.T, b []byte) { checkAgreesWithValid(t, b) })
}
