package oversell

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// realisticNode returns a Node shaped like a kubelet-registered cloud node:
// ~15 labels, a handful of annotations, five conditions, three addresses,
// daemonEndpoints, nodeInfo and 50 images (the bulk of a real node object).
func realisticNode(name, cpu, mem string, ann map[string]string) *corev1.Node {
	annotations := map[string]string{
		"node.alpha.kubernetes.io/ttl":                           "0",
		"volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"kubeadm.alpha.kubernetes.io/cri-socket":                 "unix:///run/containerd/containerd.sock",
		"csi.volume.kubernetes.io/nodeid":                        `{"ebs.csi.aws.com":"i-0a1b2c3d4e5f60718"}`,
		"projectcalico.org/IPv4Address":                          "10.0.12.34/20",
	}
	for k, v := range ann {
		annotations[k] = v
	}
	n := &corev1.Node{
		TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              name,
			UID:               types.UID("5f0c9a1e-6f3c-4d1a-9a53-2d7c1b8e4f10"),
			ResourceVersion:   "123456789",
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
			Labels: map[string]string{
				"beta.kubernetes.io/arch":                  "amd64",
				"beta.kubernetes.io/os":                    "linux",
				"kubernetes.io/arch":                       "amd64",
				"kubernetes.io/os":                         "linux",
				"kubernetes.io/hostname":                   name,
				"node.kubernetes.io/instance-type":         "m6i.2xlarge",
				"beta.kubernetes.io/instance-type":         "m6i.2xlarge",
				"topology.kubernetes.io/region":            "eu-west-1",
				"topology.kubernetes.io/zone":              "eu-west-1b",
				"failure-domain.beta.kubernetes.io/region": "eu-west-1",
				"failure-domain.beta.kubernetes.io/zone":   "eu-west-1b",
				"topology.ebs.csi.aws.com/zone":            "eu-west-1b",
				"node-role.kubernetes.io/worker":           "",
				"pool":                                     "oversell",
				"team":                                     "platform",
			},
			Annotations: annotations,
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.3.0/24", PodCIDRs: []string{"10.244.3.0/24"}, ProviderID: "aws:///eu-west-1b/i-0a1b2c3d4e5f60718"},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				"cpu": resource.MustParse("8"), "memory": resource.MustParse("32386524Ki"), "pods": resource.MustParse("110"),
				"ephemeral-storage": resource.MustParse("104845292Ki"), "hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"),
			},
			Allocatable: corev1.ResourceList{
				"cpu": resource.MustParse(cpu), "memory": resource.MustParse(mem), "pods": resource.MustParse("110"),
				"ephemeral-storage": resource.MustParse("96625420948"), "hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"),
			},
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "10.0.12.34"},
				{Type: corev1.NodeHostName, Address: "ip-10-0-12-34.eu-west-1.compute.internal"},
				{Type: corev1.NodeInternalDNS, Address: "ip-10-0-12-34.eu-west-1.compute.internal"},
			},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{
				MachineID: "ec2d3b6f4a5b4c7d8e9f0a1b2c3d4e5f", SystemUUID: "ec2d3b6f-4a5b-4c7d-8e9f-0a1b2c3d4e5f", BootID: "7b1d9c2e-3f4a-4b5c-8d6e-9f0a1b2c3d4e",
				KernelVersion: "6.8.0-1021-aws", OSImage: "Ubuntu 24.04.2 LTS", ContainerRuntimeVersion: "containerd://2.1.3",
				KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64",
			},
		},
	}
	hb := metav1.NewTime(time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC))
	for _, c := range []struct{ t, s, r, m string }{
		{"MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"},
		{"DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"},
		{"PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"},
		{"Ready", "True", "KubeletReady", "kubelet is posting ready status"},
		{"NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node"},
	} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
			Type: corev1.NodeConditionType(c.t), Status: corev1.ConditionStatus(c.s), Reason: c.r, Message: c.m,
			LastHeartbeatTime: hb, LastTransitionTime: metav1.NewTime(hb.Add(-72 * time.Hour)),
		})
	}
	for i := 0; i < 50; i++ {
		repo := fmt.Sprintf("registry.example.com/platform/team-%02d/service-%02d", i%7, i)
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
			Names: []string{
				fmt.Sprintf("%s@sha256:%064x", repo, uint64(i)*0x9e3779b97f4a7c15),
				fmt.Sprintf("%s:v1.%d.%d", repo, i%13, i%5),
			},
			SizeBytes: int64(20_000_000 + i*3_141_593),
		})
	}
	for _, mf := range []struct{ manager, sub, fields string }{
		{"kubeadm", "", `{"f:metadata":{"f:annotations":{"f:kubeadm.alpha.kubernetes.io/cri-socket":{}},"f:labels":{"f:node-role.kubernetes.io/worker":{}}}}`},
		{"kube-controller-manager", "", `{"f:metadata":{"f:annotations":{"f:node.alpha.kubernetes.io/ttl":{}}},"f:spec":{"f:podCIDR":{},"f:podCIDRs":{".":{},"v:\"10.244.3.0/24\"":{}}}}`},
		{"kubelet", "status", `{"f:metadata":{"f:annotations":{".":{},"f:csi.volume.kubernetes.io/nodeid":{},"f:volumes.kubernetes.io/controller-managed-attach-detach":{}},"f:labels":{".":{},"f:beta.kubernetes.io/arch":{},"f:beta.kubernetes.io/os":{},"f:kubernetes.io/arch":{},"f:kubernetes.io/hostname":{},"f:kubernetes.io/os":{},"f:node.kubernetes.io/instance-type":{},"f:topology.kubernetes.io/region":{},"f:topology.kubernetes.io/zone":{}}},"f:status":{"f:allocatable":{"f:cpu":{},"f:ephemeral-storage":{},"f:memory":{}},"f:capacity":{"f:cpu":{},"f:ephemeral-storage":{},"f:memory":{}},"f:conditions":{"k:{\"type\":\"DiskPressure\"}":{"f:lastHeartbeatTime":{}},"k:{\"type\":\"MemoryPressure\"}":{"f:lastHeartbeatTime":{}},"k:{\"type\":\"PIDPressure\"}":{"f:lastHeartbeatTime":{}},"k:{\"type\":\"Ready\"}":{"f:lastHeartbeatTime":{},"f:lastTransitionTime":{},"f:message":{},"f:reason":{},"f:status":{}}},"f:images":{},"f:nodeInfo":{"f:bootID":{},"f:containerRuntimeVersion":{},"f:kernelVersion":{},"f:kubeletVersion":{}},"f:volumesInUse":{}}}`},
		{"calico-node", "status", `{"f:metadata":{"f:annotations":{"f:projectcalico.org/IPv4Address":{}}},"f:status":{"f:conditions":{"k:{\"type\":\"NetworkUnavailable\"}":{".":{},"f:lastHeartbeatTime":{},"f:lastTransitionTime":{},"f:message":{},"f:reason":{},"f:status":{},"f:type":{}}}}}`},
	} {
		ts := metav1.NewTime(time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC))
		n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{
			Manager: mf.manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &ts,
			FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(mf.fields)}, Subresource: mf.sub,
		})
	}
	for i := range n.Status.Images {
		n.Status.Images[i].Names = append(n.Status.Images[i].Names,
			fmt.Sprintf("mirror.registry.example.com/cache/platform/team-%02d/service-%02d:v1.%d.%d", i%7, i, i%13, i%5))
	}
	n.Status.VolumesInUse = []corev1.UniqueVolumeName{"kubernetes.io/csi/ebs.csi.aws.com^vol-0a1b2c3d4e5f60718"}
	return n
}

// reviewFor builds an AdmissionReview v1 for an UPDATE of nodes/status.
func reviewFor(t testing.TB, user string, groups []string, obj, old *corev1.Node) []byte {
	t.Helper()
	objRaw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	oldRaw, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	dry := false
	rv := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{Kind: "AdmissionReview", APIVersion: "admission.k8s.io/v1"},
		Request: &admissionv1.AdmissionRequest{
			UID:                types.UID("0d3c6e1a-8b2f-4a7d-9c1e-5f6a7b8c9d0e"),
			Kind:               metav1.GroupVersionKind{Version: "v1", Kind: "Node"},
			Resource:           metav1.GroupVersionResource{Version: "v1", Resource: "nodes"},
			SubResource:        "status",
			RequestKind:        &metav1.GroupVersionKind{Version: "v1", Kind: "Node"},
			RequestResource:    &metav1.GroupVersionResource{Version: "v1", Resource: "nodes"},
			RequestSubResource: "status",
			Name:               obj.Name,
			Operation:          admissionv1.Update,
			UserInfo:           authnv1.UserInfo{Username: user, UID: "a7d3", Groups: groups},
			Object:             runtime.RawExtension{Raw: objRaw},
			OldObject:          runtime.RawExtension{Raw: oldRaw},
			DryRun:             &dry,
			Options:            runtime.RawExtension{Raw: []byte(`{"kind":"PatchOptions","apiVersion":"meta.k8s.io/v1","fieldManager":"kubelet"}`)},
		},
	}
	b, err := json.Marshal(&rv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var kubeletGroups = []string{"system:nodes", "system:authenticated"}

// staticSource serves a fixed snapshot.
type staticSource struct{ s *Snapshot }

func (s staticSource) snapshot() *Snapshot { return s.s }

// testHandler returns a handler over snap with a private registry.
func testHandler(t testing.TB, snap *Snapshot) (*Handler, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return NewHandler(staticSource{snap}, m, logr.Discard()), m
}

// poolSnapshot is a synced snapshot with NodeOversell oversell-pool
// (pool=oversell, cpu 2, memory 1.5).
func poolSnapshot(t testing.TB) *Snapshot {
	t.Helper()
	return BuildSnapshot(nodeOversells(t, "oversell-pool", "2", "1.5", 0, time.Unix(1000, 0)), []string{"harness"}, true)
}
