package controllers

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hookwright/hookwright/api/v1alpha1"
	"github.com/hookwright/hookwright/internal/desired"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var testSettings = Settings{Settings: desired.Settings{Namespace: "hookwright-system", Image: "ghcr.io/hookwright/hookwright:v1.2.3"}}

func testInjector() *v1alpha1.SidecarInjector {
	return &v1alpha1.SidecarInjector{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh", UID: types.UID("11111111-2222-3333-4444-555555555555"), Generation: 3},
		Spec: v1alpha1.SidecarInjectorSpec{
			NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"sidecar-injection": "enabled"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "api"},
				}},
			},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"mesh": "on"}},
		},
	}
}

func testOversell() *v1alpha1.NodeOversell {
	return &v1alpha1.NodeOversell{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", UID: types.UID("66666666-7777-8888-9999-000000000000"), Generation: 1},
		Spec: v1alpha1.NodeOversellSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "oversell"}},
			Ratios:       v1alpha1.OversellRatios{CPU: "2", Memory: "1.5"},
			Server: v1alpha1.ServerSpec{
				Namespace: "nodes-system", Replicas: ptr.To[int32](1), Image: "example.com/hw:custom",
				Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.2")}},
			},
		},
	}
}
