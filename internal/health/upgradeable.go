package health

import (
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons of the Upgradeable condition.
const (
	reasonUpgradeable    = "NoDisruptiveWorkInProgress"
	reasonNotUpgradeable = "DisruptiveWorkInProgress"
)

// UpgradeableState is the Upgradeable status and message for holds.
func UpgradeableState(holds map[string]string) (metav1.ConditionStatus, string, string) {
	if len(holds) == 0 {
		return metav1.ConditionTrue, reasonUpgradeable, "no CA rotation or NodeOversell restore in progress"
	}
	var why []string
	for _, k := range slices.Sorted(maps.Keys(holds)) {
		why = append(why, holds[k])
	}
	return metav1.ConditionFalse, reasonNotUpgradeable, "in progress: " + strings.Join(why, "; ")
}
