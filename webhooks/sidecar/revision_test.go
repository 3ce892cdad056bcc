package sidecar

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hookwright/hookwright/api/v1alpha1"
)

// TestRevision: the revision moves with what is injected (templates,
// values, default templates, native mode) and with nothing else.
func TestRevision(t *testing.T) {
	base, _ := Revision(sampleCR(t))
	cases := []struct {
		name    string
		edit    func(*v1alpha1.SidecarInjector)
		changes bool
	}{
		{"template text", func(c *v1alpha1.SidecarInjector) { c.Spec.Templates[0].Template += "\n# x" }, true},
		{"values", func(c *v1alpha1.SidecarInjector) { c.Spec.Values = &apiextensionsv1.JSON{Raw: []byte(`{"x":1}`)} }, true},
		{"default templates", func(c *v1alpha1.SidecarInjector) { c.Spec.DefaultTemplates = nil }, true},
		{"native mode", func(c *v1alpha1.SidecarInjector) { c.Spec.NativeSidecars = v1alpha1.NativeSidecarDisabled }, true},
		{"object selector", func(c *v1alpha1.SidecarInjector) {
			c.Spec.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
		}, false},
		{"never selector", func(c *v1alpha1.SidecarInjector) {
			c.Spec.NeverInjectSelector = []metav1.LabelSelector{{MatchLabels: map[string]string{"a": "b"}}}
		}, false},
		{"replicas", func(c *v1alpha1.SidecarInjector) { n := int32(5); c.Spec.Server.Replicas = &n }, false},
		{"certificate", func(c *v1alpha1.SidecarInjector) { c.Spec.Certificate.Mode = v1alpha1.CertificateSecret }, false},
		{"policy", func(c *v1alpha1.SidecarInjector) { c.Spec.Policy = v1alpha1.PolicyDisabled }, false},
		{"generation", func(c *v1alpha1.SidecarInjector) { c.Generation++ }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cr := sampleCR(t)
			tc.edit(cr)
			got, data := Revision(cr)
			if (got != base) != tc.changes {
				t.Errorf("revision %s, base %s: changed=%t, want %t", got, base, got != base, tc.changes)
			}
			var rc RevisionContent
			if err := json.Unmarshal(data, &rc); err != nil {
				t.Fatalf("revision data: %v", err)
			}
		})
	}
}

// TestRevisionLabel: an injected pod carries the revision as a label, the
// same as the status annotation's configHash and Compile's Hash.
func TestRevisionLabel(t *testing.T) {
	cfg := sampleConfig(t)
	rev, _ := Revision(sampleCR(t))
	if cfg.Hash != rev {
		t.Fatalf("Config.Hash %s, Revision %s", cfg.Hash, rev)
	}
	res, err := Inject(cfg, testParams, Input{Raw: goldenPodJSON(t, "pod-foreign-init.yaml"), Namespace: "payments", WantJSON: true})
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(res.JSON, &pod); err != nil {
		t.Fatal(err)
	}
	if got := pod.Metadata.Labels[v1alpha1.SidecarRevisionKey]; got != rev {
		t.Errorf("label %s=%q, want %q", v1alpha1.SidecarRevisionKey, got, rev)
	}
	if res.Status.ConfigHash != rev {
		t.Errorf("configHash %q, want %q", res.Status.ConfigHash, rev)
	}
}

// TestServedPinned: spec.revision with status.pinned holding it serves the
// pinned content under the pinned revision; unresolved, the store keeps
// what it serves; unpinned again, the spec's.
func TestServedPinned(t *testing.T) {
	old := sampleCR(t)
	oldRev, oldData := Revision(old)
	var rc RevisionContent
	if err := json.Unmarshal(oldData, &rc); err != nil {
		t.Fatal(err)
	}
	cr := sampleCR(t)
	cr.UID = "u1"
	cr.Generation = 2
	cr.Spec.Values = &apiextensionsv1.JSON{Raw: []byte(`{"proxy":{"image":"new","initImage":"new","port":1,"adminPort":2,"uid":3,"logLevel":"info","resources":{}},"logging":{"image":"l","endpoint":"e","resources":{}}}`)}
	newRev, _ := Revision(cr)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{}
	s.Offer(cr.Name, cr, m, logr.Discard())
	if got := s.Load().Hash; got != newRev {
		t.Fatalf("unpinned: serving %s, want %s", got, newRev)
	}
	// Pinned, not resolved yet: the store keeps serving.
	cr.Generation = 3
	cr.Spec.Revision = oldRev
	if _, _, resolved := Served(cr); resolved {
		t.Fatal("resolved without status.pinned")
	}
	s.Offer(cr.Name, cr, m, logr.Discard())
	if got := s.Load().Hash; got != newRev {
		t.Fatalf("unresolved pin: serving %s, want %s still", got, newRev)
	}
	// Resolved: a status-only update swaps to the pinned content.
	cr.Status.Pinned = &v1alpha1.PinnedRevision{Revision: oldRev, Templates: rc.Templates, DefaultTemplates: rc.DefaultTemplates, Values: rc.Values, NativeSidecars: rc.NativeSidecars}
	s.Offer(cr.Name, cr, m, logr.Discard())
	if got := s.Load().Hash; got != oldRev {
		t.Fatalf("pinned: serving %s, want %s", got, oldRev)
	}
	res, err := Inject(s.Load(), testParams, Input{Raw: goldenPodJSON(t, "pod-foreign-init.yaml"), Namespace: "payments", WantJSON: true})
	if err != nil || !strings.Contains(string(res.JSON), "ghcr.io/hookwright/proxy:1.4.2") || res.Status.ConfigHash != oldRev {
		t.Fatalf("pinned injection: %v %s", err, res.JSON)
	}
	// Unpinned: the spec's again.
	cr.Generation = 4
	cr.Spec.Revision = ""
	s.Offer(cr.Name, cr, m, logr.Discard())
	if got := s.Load().Hash; got != newRev {
		t.Fatalf("unpinned again: serving %s, want %s", got, newRev)
	}
}
