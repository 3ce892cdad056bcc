package health

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestUpgradeableState(t *testing.T) {
	st, reason, msg := UpgradeableState(map[string]string{"restore/b": "NodeOversell b restoring its nodes", "ca-rotation": "CA rotation"})
	if st != metav1.ConditionFalse || reason != reasonNotUpgradeable || msg != "in progress: CA rotation; NodeOversell b restoring its nodes" {
		t.Fatalf("%s %s %q", st, reason, msg)
	}
	if st, _, _ := UpgradeableState(nil); st != metav1.ConditionTrue {
		t.Fatal(st)
	}
}
