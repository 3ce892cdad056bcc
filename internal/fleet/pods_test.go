package fleet

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var intstrHTTP = intstr.FromInt32(8080)

// realisticPod is an injected Deployment pod as the API server returns
// it: managedFields, env, probes, a projected token volume, status.
func realisticPod(tb *testing.T, inj Injector, i int) []byte {
	p := pod(fmt.Sprintf("ns-%d", i%100), fmt.Sprintf("web-7d9f8c6b5-%05d", i), map[string]string{
		"app": "web", "pod-template-hash": "7d9f8c6b5", "app.kubernetes.io/name": "web", "version": "v3"})
	p.UID = "0b5c2f63-3c1e-4d4e-9a34-5b1f9a3d2c10"
	p.ResourceVersion = "123456"
	p.GenerateName = "web-7d9f8c6b5-"
	p.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8c6b5", UID: "9e6e2d1a-5b1f-4c4e-8a34-1b1f9a3d2c11"}}
	c := &p.Spec.Containers[0]
	c.Image = "registry.example.com/team/web:1.27.3"
	for j := range 8 {
		c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", j), Value: strings.Repeat("v", 24)})
	}
	c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}
	c.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")}}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrHTTP}}, PeriodSeconds: 10}
	c.ReadinessProbe, c.LivenessProbe = probe, probe
	c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
		{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
	}}}}}
	p.Spec.NodeName = fmt.Sprintf("kwok-node-%d", i%10)
	p.Spec.ServiceAccountName = "default"
	p.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	out := injected(tb, inj, p)
	out.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"9e6e\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:env":{},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:ports":{},"f:readinessProbe":{},"f:resources":{}}}}}`)}},
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", Subresource: "status", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{}},"f:containerStatuses":{},"f:hostIP":{},"f:phase":{},"f:podIP":{},"f:podIPs":{},"f:startTime":{}}}`)}},
	}
	out.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.0.0.1", PodIP: "10.244.1.7", PodIPs: []corev1.PodIP{{IP: "10.244.1.7"}}, StartTime: &metav1.Time{Time: t0}}
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady, "PodReadyToStartContainers"} {
		out.Status.Conditions = append(out.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Time{Time: t0}})
	}
	for _, c := range append(append([]corev1.Container{}, out.Spec.InitContainers...), out.Spec.Containers...) {
		out.Status.ContainerStatuses = append(out.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "sha256:" + strings.Repeat("a", 64),
			ContainerID: "containerd://" + strings.Repeat("b", 64), Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Time{Time: t0}}}})
	}
	b, err := json.Marshal(out)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
