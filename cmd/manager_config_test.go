package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The manager runs several replicas, so config/manager ships a
// PodDisruptionBudget over exactly its pods that lets a drain proceed one
// pod at a time, whatever the replica count.
func TestManagerPodDisruptionBudget(t *testing.T) {
	dir := filepath.Join("..", "config", "manager")
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var dep appsv1.Deployment
	for _, doc := range strings.Split(string(read("manager.yaml")), "\n---\n") {
		if strings.Contains(doc, "kind: Deployment") {
			if err := yaml.UnmarshalStrict([]byte(doc), &dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Fatalf("manager replicas %v", dep.Spec.Replicas)
	}
	var kust struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(read("kustomization.yaml"), &kust); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(kust.Resources, "pdb.yaml") {
		t.Fatalf("config/manager/kustomization.yaml resources %v lack pdb.yaml", kust.Resources)
	}
	var pdb policyv1.PodDisruptionBudget
	if err := yaml.UnmarshalStrict(read("pdb.yaml"), &pdb); err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if pdb.Namespace != dep.Namespace || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) ||
		!labels.Equals(pdb.Spec.Selector.MatchLabels, dep.Spec.Selector.MatchLabels) {
		t.Fatalf("PDB %s/%s selector %v does not select the manager's pods %v", pdb.Namespace, pdb.Name, pdb.Spec.Selector, dep.Spec.Template.Labels)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Fatalf("PDB budget maxUnavailable %v minAvailable %v, want maxUnavailable 1 only", pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
	}
}
