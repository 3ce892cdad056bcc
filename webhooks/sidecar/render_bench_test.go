package sidecar

import (
	"context"
	"testing"
)

// BenchmarkRender is one template execution as the injector runs it
// (renderOne, a cache hit for the YAML): "proxy" is the sample CR's proxy
// sidecar, "loop" a template of 10,000 range iterations, so 156 readings of
// the render meter (one per 64 steps), which shows what a reading costs.
func BenchmarkRender(b *testing.B) {
	cfg := sampleConfig(b)
	loop, err := Compile(bombCR(`{{ range until 10000 }}{{ end }}`))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		cfg  *Config
		tmpl string
	}{{"proxy", cfg, "proxy"}, {"loop", loop, "bomb"}} {
		t := bc.cfg.templates[bc.tmpl]
		data := trialData(bc.cfg, true)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := bc.cfg.renderOne(context.Background(), t, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
