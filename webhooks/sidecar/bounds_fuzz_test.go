package sidecar

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzTemplateBounds compiles an arbitrary template and renders it for a pod
// whose annotation "a" is an arbitrary string: whatever the two are, a
// render ends with at most maxRenderBytes of output or an error (never a
// panic), and one input allocates a bounded amount of memory. Seeds are the
// bombs of TestBoundedFunctions plus testdata/fuzz/FuzzTemplateBounds.
func FuzzTemplateBounds(f *testing.F) {
	for _, s := range [][2]string{
		{`{{ range until 20000000 }}x{{ end }}`, ""},
		{`{{ annotation .ObjectMeta "a" "" | quote }}`, "x\"\ny"},
		{`{{ $s := annotation .ObjectMeta "a" "" }}{{ range until 64 }}{{ $s = cat $s $s }}{{ end }}{{ $s }}`, "abc"},
		{`{{ repeat 1000 (annotation .ObjectMeta "a" "") }}`, "0123456789abcdef"},
		{`{{ annotation .ObjectMeta "a" "" | indent 1000 }}`, "\n\n\n\n\n\n\n\n"},
		{`{{ $d := dict }}{{ $_ := set $d "k" $d }}{{ toJson $d }}`, ""},
		{`{{ printf (annotation .ObjectMeta "a" "%s") 1 2 3 }}`, "%999999d%999999d"},
		{`{{ regexReplaceAll "" (annotation .ObjectMeta "a" "") "xxxxxxxxxx" }}`, "aaaaaaaaaaaaaaaa"},
		{`{{ $l := until 300 }}{{ range $l }}{{ range $l }}{{ range $l }}{{ end }}{{ end }}{{ end }}`, ""},
		{`{{ define "a" }}{{ template "a" }}{{ end }}{{ template "a" }}`, ""},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, text, ann string) {
		tm, err := template.New("t").Funcs(FuncMap()).Parse(text)
		if err != nil {
			return
		}
		if err := instrument(tm); err != nil {
			return
		}
		ct := &compiledTemplate{name: "t", tmpl: tm}
		data := &templateData{
			ObjectMeta: &metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"a": ann}},
			Namespace:  "default",
			Values:     map[string]any{},
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var buf bytes.Buffer
		err = ct.execute(context.Background(), &buf, data)
		runtime.ReadMemStats(&after)
		if buf.Len() > maxRenderBytes {
			t.Fatalf("rendered %d bytes", buf.Len())
		}
		var re *RenderError
		if err != nil && !errors.As(err, &re) {
			t.Fatalf("error %T %v", err, err)
		}
		// About 16 values at the limit, or the limit in scratch lists of
		// strings (16 bytes each) from split or regexFindAll.
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<20 {
			t.Fatalf("allocated %d MiB (error %v)", grew>>20, err)
		}
	})
}
