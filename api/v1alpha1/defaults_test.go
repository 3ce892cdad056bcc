package v1alpha1

import (
	"encoding/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// crdSchema is the structural schema of version v1alpha1 in the generated
// CRD file (config/crd/bases, made from the markers by make manifests).
func crdSchema(t *testing.T, file string) *structuralschema.Structural {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", file))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name != GroupVersion.Version {
			continue
		}
		var internal apiextensions.JSONSchemaProps
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
			t.Fatal(err)
		}
		s, err := structuralschema.NewStructural(&internal)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Fatalf("%s has no version %s", file, GroupVersion.Version)
	return nil
}

// serverDefault is what the API server stores for obj: its JSON defaulted
// by the CRD schema with the apiextensions-apiserver's own algorithm.
func serverDefault[T any](t *testing.T, s *structuralschema.Structural, obj *T) *T {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var u map[string]any
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatal(err)
	}
	defaulting.Default(u, s)
	if b, err = json.Marshal(u); err != nil {
		t.Fatal(err)
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDefaultsMatchMarkers: Default gives what the CRD's defaults give, for
// empty objects (every default applies, the issuerRef ones included) and
// full ones (none does), so a marker and the function cannot disagree.
func TestDefaultsMatchMarkers(t *testing.T) {
	ref := func() *IssuerReference { return &IssuerReference{Name: "ca"} }
	t.Run("SidecarInjector", func(t *testing.T) {
		s := crdSchema(t, "admission.hookwright.io_sidecarinjectors.yaml")
		full := SidecarInjectorSpec{
			Policy: PolicyDisabled, NativeSidecars: NativeSidecarDisabled, FailurePolicy: FailurePolicyIgnore,
			TimeoutSeconds: ptr.To[int32](3), ReinvocationPolicy: ReinvocationNever,
			Server:      ServerSpec{Replicas: ptr.To[int32](5)},
			Certificate: CertificateSpec{Mode: CertificateCertManager, IssuerRef: &IssuerReference{Name: "ca", Kind: "ClusterIssuer", Group: "example.com"}},
		}
		for name, spec := range map[string]SidecarInjectorSpec{
			"empty": {}, "issuerRef": {Certificate: CertificateSpec{IssuerRef: ref()}}, "full": full,
			"rollout": {Rollout: RolloutSpec{Strategy: RolloutInPlace, Partition: ptr.To(intstr.FromString("50%"))}},
		} {
			in := &SidecarInjector{Spec: spec}
			want := serverDefault(t, s, in)
			if got := in.WithDefaults(); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: Default gives\n%+v\nthe CRD defaults give\n%+v", name, got.Spec, want.Spec)
			}
		}
	})
	t.Run("NodeOversell", func(t *testing.T) {
		s := crdSchema(t, "admission.hookwright.io_nodeoversells.yaml")
		full := NodeOversellSpec{
			Priority: 7, FailurePolicy: FailurePolicyFail, TimeoutSeconds: ptr.To[int32](4),
			Server:      ServerSpec{Replicas: ptr.To[int32](1)},
			Certificate: CertificateSpec{Mode: CertificateSecret, SecretName: "tls"},
		}
		for name, spec := range map[string]NodeOversellSpec{
			"empty": {}, "issuerRef": {Certificate: CertificateSpec{IssuerRef: ref()}}, "full": full,
			"usage":       {Usage: &OversellUsage{}},
			"usageTarget": {Usage: &OversellUsage{TargetUtilization: &TargetUtilization{CPU: ptr.To[int32](50)}}},
			"usageFull": {Usage: &OversellUsage{
				TargetUtilization: &TargetUtilization{CPU: ptr.To[int32](50), Memory: ptr.To[int32](70)},
				Interval:          &metav1.Duration{Duration: 5 * time.Second}, MinChangeInterval: &metav1.Duration{},
				MaxStep: "1", DeadBand: "0", FallbackRatio: "2", StaleAfter: &metav1.Duration{Duration: time.Minute},
				PressureThreshold: &PressureThreshold{CPU: ptr.To[int32](90)}, PressureHold: &metav1.Duration{Duration: time.Second},
			}},
		} {
			in := &NodeOversell{Spec: spec}
			want := serverDefault(t, s, in)
			if got := in.WithDefaults(); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: Default gives\n%+v\nthe CRD defaults give\n%+v", name, got.Spec, want.Spec)
			}
		}
	})
}

// Default leaves the object it was called through the same as WithDefaults.
func TestWithDefaultsCopies(t *testing.T) {
	si := &SidecarInjector{}
	if d := si.WithDefaults(); d.Spec.Policy != PolicyEnabled || si.Spec.Policy != "" {
		t.Fatalf("WithDefaults changed its receiver or did not default: %q %q", d.Spec.Policy, si.Spec.Policy)
	}
}
