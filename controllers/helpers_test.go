package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var testSettings = Settings{Settings: desired.Settings{Namespace: "hookwright-system", Image: "ghcr.io/hookwright/hookwright:v1.2.3"}}

// testInjector and testOversell are minimal CRs; internal/desired's tests
// pin what is built from full ones.
func testInjector() *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{ObjectMeta: metav1.ObjectMeta{Name: "mesh", UID: types.UID("11111111-2222-3333-4444-555555555555"), Generation: 3}}
}

func testOversell() *v1alpha1.NodeOversell {
	return &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", UID: types.UID("66666666-7777-8888-9999-000000000000"), Generation: 1},
		Spec:       v1alpha1.NodeOversellSpec{Server: v1alpha1.ServerSpec{Namespace: "nodes-system", Replicas: ptr.To[int32](1)}},
	}
}

// testScheme holds client-go's kinds and ours, for fake clients.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
