package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
	"text/template"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// bombCR is a SidecarInjector whose only template is body, under a
// valid partial pod, so a bounded render fails only on its limit.
func bombCR(body string) *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{Spec: v1alpha1.SidecarInjectorSpec{
		DefaultTemplates: []string{"bomb"},
		Templates: []v1alpha1.NamedTemplate{{Name: "bomb",
			Template: "metadata:\n  annotations:\n    x: \"" + body + "\"\n"}},
	}}
}

// Each bounded function, called with an argument that would allocate far
// beyond the limits, fails with a *limitError naming the limit; with a
// normal argument it renders what sprig renders.
func TestBoundedFunctions(t *testing.T) {
	longTimeout(t)
	for _, tc := range []struct {
		name, body string
		// want is the rendered annotation; limit the limit's name when the
		// render must fail.
		want, limit string
	}{
		{"until", `{{ range until 3 }}{{ . }}{{ end }}`, "012", ""},
		{"until negative", `{{ range until -2 }}{{ . }}{{ end }}`, "0-1", ""},
		{"until bomb", `{{ range until 200000000 }}x{{ end }}`, "", "MaxValueBytes"},
		{"untilStep", `{{ range untilStep 1 10 4 }}{{ . }}{{ end }}`, "159", ""},
		{"untilStep down", `{{ range untilStep 5 0 -2 }}{{ . }}{{ end }}`, "531", ""},
		{"untilStep bomb", `{{ range untilStep 0 9000000000000000000 1 }}x{{ end }}`, "", "MaxValueBytes"},
		{"untilStep overflow", `{{ range untilStep 0 9223372036854775807 4611686018427387904 }}{{ . }},{{ end }}`, "0,4611686018427387904,", ""},
		{"seq", `{{ seq 3 }}|{{ seq 2 4 }}|{{ seq 0 2 6 }}|{{ seq 3 1 }}`, "1 2 3|2 3 4|0 2 4 6|3 2 1", ""},
		{"seq bomb", `{{ seq 1 100000000 }}`, "", "MaxValueBytes"},
		{"repeat", `{{ repeat 3 "ab" }}`, "ababab", ""},
		{"repeat bomb", `{{ repeat 100000000 "ab" }}`, "", "MaxValueBytes"},
		{"indent", `{{ "a\nb" | indent 2 | replace "\n" "|" }}`, "  a|  b", ""},
		{"indent bomb", `{{ "a" | indent 100000000 }}`, "", "MaxValueBytes"},
		{"nindent bomb", `{{ "a" | nindent 100000000 }}`, "", "MaxValueBytes"},
		{"randAlphaNum", `{{ randAlphaNum 5 | len }}`, "5", ""},
		{"randAlphaNum bomb", `{{ randAlphaNum 100000000 | len }}`, "", "MaxValueBytes"},
		{"randAlpha bomb", `{{ randAlpha 100000000 | len }}`, "", "MaxValueBytes"},
		{"randNumeric bomb", `{{ randNumeric 100000000 | len }}`, "", "MaxValueBytes"},
		{"randAscii bomb", `{{ randAscii 100000000 | len }}`, "", "MaxValueBytes"},
		{"randBytes bomb", `{{ randBytes 100000000 | len }}`, "", "MaxValueBytes"},
		{"replace", `{{ replace "b" "xy" "abc" }}`, "axyc", ""},
		{"replace bomb", `{{ $s := repeat 2000 "a" }}{{ replace "" (repeat 1000 "b") $s | len }}`, "", "MaxValueBytes"},
		{"wrapWith bomb", `{{ $s := repeat 100000 "a" }}{{ wrapWith 1 (repeat 100 "-") $s | len }}`, "", "MaxValueBytes"},
		{"join", `{{ list "a" "b" | join "," }}`, "a,b", ""},
		{"join bomb", `{{ $l := until 60000 }}{{ join (repeat 1000 "-") $l | len }}`, "", "MaxValueBytes"},
		{"regexReplaceAll", `{{ regexReplaceAll "a(x*)b" "-ab-axxb-" "${1}W" }}`, "-W-xxW-", ""},
		{"regexReplaceAll bomb", `{{ regexReplaceAll "" (repeat 10000 "a") (repeat 1000 "b") | len }}`, "", "MaxValueBytes"},
		{"regexReplaceAllLiteral bomb", `{{ regexReplaceAllLiteral "a" (repeat 10000 "a") (repeat 1000 "b") | len }}`, "", "MaxValueBytes"},
		{"printf", `{{ printf "%03d-%s" 7 "x" }}`, "007-x", ""},
		{"printf width bomb", `{{ printf "%999999d%999999d" 1 2 | len }}`, "", "MaxValueBytes"},
		{"printf star bomb", `{{ printf "%*d%*d" 999999 1 999999 2 | len }}`, "", "MaxValueBytes"},
		{"printf list width bomb", `{{ printf "%99999v" (until 100) | len }}`, "", "MaxValueBytes"},
		{"cat doubling", `{{ $s := "xxxxxxxx" }}{{ range until 40 }}{{ $s = cat $s $s }}{{ end }}{{ len $s }}`, "", "MaxValueBytes"},
		{"quote doubling", `{{ $s := "\"" }}{{ range until 40 }}{{ $s = quote $s }}{{ end }}{{ len $s }}`, "", "MaxValueBytes"},
		{"b64enc growth", `{{ $s := "xxxxxxxx" }}{{ range until 100 }}{{ $s = b64enc $s }}{{ end }}{{ len $s }}`, "", "MaxValueBytes"},
		{"list doubling", `{{ $l := list 1 }}{{ range until 40 }}{{ $l = list $l $l }}{{ end }}{{ len $l }}`, "", "MaxValueBytes"},
		{"concat doubling", `{{ $l := list 1 }}{{ range until 40 }}{{ $l = concat $l $l }}{{ end }}{{ len $l }}`, "", "MaxValueBytes"},
		{"dict holding itself", `{{ $d := dict }}{{ $_ := set $d "k" $d }}{{ $d }}`, "", "MaxValueBytes"},
		{"shared then grown", `{{ $a := dict }}{{ $b := list }}{{ range until 1000 }}{{ $b = append $b $a }}{{ end }}{{ $_ := set $a "k" (repeat 2000 "x") }}{{ $b }}`, "", "MaxRenderBytes"},
		{"shared then grown toJson", `{{ $a := dict }}{{ $b := list }}{{ range until 1000 }}{{ $b = append $b $a }}{{ end }}{{ $_ := set $a "k" (repeat 2000 "x") }}{{ toJson $b }}`, "", "MaxValueBytes"},
		{"print of shared", `{{ $a := dict }}{{ $b := list }}{{ range until 1000 }}{{ $b = append $b $a }}{{ end }}{{ $_ := set $a "k" (repeat 2000 "x") }}{{ print $b | len }}`, "", "MaxValueBytes"},
		{"output", `{{ range until 2000 }}{{ repeat 1000 "x" }}{{ end }}`, "", "MaxRenderBytes"},
		{"nested empty loops", `{{ $l := until 10000 }}{{ range $l }}{{ range $l }}{{ end }}{{ end }}`, "", "MaxRenderSteps"},
		{"template fan-out", `{{ define "a" }}{{ end }}{{ define "b" }}{{ template "a" }}{{ template "a" }}{{ template "a" }}{{ template "a" }}{{ end }}{{ define "c" }}{{ range until 30000 }}{{ template "b" }}{{ end }}{{ end }}{{ template "c" }}`, "", "MaxRenderSteps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			cpu0, cpuOK := processCPUTime()
			cfg, err := Compile(bombCR(tc.body))
			// Not a timing assertion on the limit: unbounded, these run
			// for minutes or exhaust memory. Judged on the CPU the process
			// used, which a loaded machine does not stretch as it does
			// wall time (the wall time is then a figure).
			wall := time.Since(start)
			d, clock := wall, "wall time"
			if cpu1, ok := processCPUTime(); ok && cpuOK {
				d, clock = cpu1-cpu0, "CPU"
				if wall > time.Second {
					t.Logf("figure: %s of CPU in %s of wall time", d, wall)
				}
			}
			if d > 5*time.Second {
				t.Errorf("took %s of %s", d, clock)
			}
			if tc.limit == "" {
				if err != nil {
					t.Fatal(err)
				}
				p, err := cfg.renderOne(context.Background(), cfg.templates["bomb"], trialData(cfg, false))
				if err != nil {
					t.Fatal(err)
				}
				if got := p.annotations["x"]; got != tc.want {
					t.Errorf("rendered %q, want %q", got, tc.want)
				}
				return
			}
			var le *limitError
			if !errors.As(err, &le) || le.Limit != tc.limit {
				t.Fatalf("error %v, want a %s LimitError", err, tc.limit)
			}
			for _, want := range []string{`template "bomb"`, tc.limit} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// longTimeout lifts maxRenderCPU and maxRenderWall for a test of the
// other limits.
func longTimeout(t *testing.T) {
	renderCPU, renderWall = time.Minute, time.Minute
	t.Cleanup(func() { renderCPU, renderWall = maxRenderCPU, maxRenderWall })
}

// shortCPU shortens maxRenderCPU to d for one test.
func shortCPU(t *testing.T, d time.Duration) {
	renderCPU = d
	t.Cleanup(func() { renderCPU = maxRenderCPU })
}

// A render that makes no progress towards another limit ends at
// maxRenderCPU (shortened here).
func TestRenderTimeout(t *testing.T) {
	shortCPU(t, time.Millisecond)
	cfg, err := Compile(bombCR(`x`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.templates["bomb"] = mustBomb(t, `{{ $l := until 50000 }}{{ range $l }}{{ range $l }}{{ end }}{{ end }}`)
	_, err = cfg.renderOne(context.Background(), cfg.templates["bomb"], trialData(cfg, false))
	var le *limitError
	if !errors.As(err, &le) || le.Limit != "MaxRenderCPUTime" || !strings.Contains(err.Error(), `template "bomb"`) {
		t.Fatalf("got %v", err)
	}
}

// A render whose time goes into its last few calls (one slow function
// call, fewer than the 64 steps between clock reads) is still stopped at
// maxRenderCPU (shortened here): the clock is read when it ends. Before,
// a single regexMatch of 9 s rendered without error (now maxCallWork
// bounds that; sortAlpha of 40,000 numbers takes tens of ms in one call).
func TestRenderTimeoutAfterTheLastStep(t *testing.T) {
	shortCPU(t, time.Millisecond)
	cfg, err := Compile(bombCR(`x`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.templates["bomb"] = mustBomb(t, "metadata:\n  annotations:\n    x: \"{{ sortAlpha (until 40000) | len }}\"\n")
	_, err = cfg.renderOne(context.Background(), cfg.templates["bomb"], trialData(cfg, false))
	var le *limitError
	if !errors.As(err, &le) || le.Limit != "MaxRenderCPUTime" || !strings.Contains(err.Error(), `template "bomb"`) {
		t.Fatalf("got %v", err)
	}
}

func mustBomb(t *testing.T, text string) *compiledTemplate {
	t.Helper()
	tm, err := template.New("bomb").Funcs(FuncMap()).Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := instrument(tm); err != nil {
		t.Fatal(err)
	}
	return &compiledTemplate{name: "bomb", tmpl: tm}
}

// Functions that cost seconds of CPU a call are not defined: a template
// using one does not parse.
func TestDroppedFunctions(t *testing.T) {
	for _, fn := range droppedFuncs {
		_, err := Compile(bombCR(`{{ ` + fn + ` }}`))
		if err == nil || !strings.Contains(err.Error(), `function "`+fn+`" not defined`) {
			t.Errorf("%s: %v", fn, err)
		}
	}
}

func TestRecursiveTemplateRejected(t *testing.T) {
	_, err := Compile(bombCR(`{{ define "a" }}{{ template "b" }}{{ end }}{{ define "b" }}{{ template "a" }}{{ end }}{{ template "a" }}`))
	if err == nil || !strings.Contains(err.Error(), "recursive template call") {
		t.Fatalf("got %v", err)
	}
}

// A render stops at its context: a loop that would run for minutes returns
// the context's error.
func TestRenderStopsWhenCanceled(t *testing.T) {
	cfg, err := Compile(bombCR(`{{ if eq .Namespace "slow" }}{{ $l := until 900 }}{{ range $l }}{{ range $l }}{{ end }}{{ end }}{{ end }}`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	data := trialData(cfg, false)
	data.Namespace = "slow"
	_, err = cfg.renderOne(ctx, cfg.templates["bomb"], data)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

// The trial render of a template bomb ends on its limit with the heap
// bounded: unbounded, until 20000000 allocated 160 MB before writing.
func TestTemplateBombMemory(t *testing.T) {
	for _, body := range []string{
		`{{ range until 20000000 }}x{{ end }}`,
		`{{ range until 100000 }}{{ range until 100000 }}x{{ end }}{{ end }}`,
		`{{ $s := "x" }}{{ range until 64 }}{{ $s = print $s $s }}{{ end }}`,
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := Compile(bombCR(body))
		runtime.ReadMemStats(&after)
		var le *limitError
		if !errors.As(err, &le) {
			t.Fatalf("%s: %v", body, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("%s: allocated %d MiB", body, grew>>20)
		}
	}
}

func TestRenderCacheBytes(t *testing.T) {
	var c renderCache
	big := make([]byte, renderCacheMaxEntry+1)
	c.put(big, nil)
	if _, ok := c.get(big); ok {
		t.Error("an entry above renderCacheMaxEntry was cached")
	}
	k := make([]byte, 30<<10)
	for i := 0; i < 1000; i++ {
		k[0], k[1] = byte(i), byte(i>>8)
		c.put(k, nil)
		if c.bytes > renderCacheMaxBytes || len(c.m) > renderCacheMax {
			t.Fatalf("cache holds %d bytes in %d entries", c.bytes, len(c.m))
		}
	}
}

// measure visits every element, so a value holding itself ends at the
// limit rather than looping.
func TestMeasure(t *testing.T) {
	d := map[string]any{}
	d["self"] = d
	if _, ok := measure(d, 1000); ok {
		t.Error("self-containing map measured within 1000")
	}
	if n, ok := measure(map[string]any{"a": []any{"bc", 1}}, 1000); !ok || n == 0 || n > 200 {
		t.Errorf("small map measured %d %t", n, ok)
	}
}

// A pod annotation that drives an amplifier (here the repeat count) is
// denied by the injector with the template and the limit named; a normal
// value still injects. The trial render passed, with the default.
func TestPodAnnotationBombDenied(t *testing.T) {
	cr := bombCR(`{{ repeat (annotation .ObjectMeta "n" "1" | atoi) "x" }}`)
	cr.Name = "bombs"
	cfg, err := Compile(cr)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHandler(t, cfg)
	for _, tc := range []struct {
		n       string
		allowed bool
	}{{"3", true}, {"100000000", false}} {
		pod := `{"metadata":{"name":"p","annotations":{"n":"` + tc.n + `"}},"spec":{"containers":[{"name":"a","image":"a"}]}}`
		rec := serve(h, reviewFor(t, []byte(pod), "shop", false), "application/json")
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("n=%s: %v %s", tc.n, err, rec.Body.Bytes())
		}
		if out.Response.Allowed != tc.allowed {
			t.Fatalf("n=%s: allowed %t: %+v", tc.n, out.Response.Allowed, out.Response.Result)
		}
		if tc.allowed {
			continue
		}
		msg := out.Response.Result.Message
		for _, want := range []string{"bombs", `template "bomb"`, "MaxValueBytes", "1048576"} {
			if !strings.Contains(msg, want) {
				t.Errorf("denial %q lacks %q", msg, want)
			}
		}
	}
}
