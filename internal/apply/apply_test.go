package apply

import (
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

func mustMap(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDrift(t *testing.T) {
	desired := `
apiVersion: v1
kind: Service
metadata: {name: s, labels: {a: "1"}}
spec:
  ports: [{port: 443, targetPort: 9443}]
  selector: {app: x}
`
	for _, tc := range []struct {
		name, live string
		want       []string
	}{
		{"identical", desired, nil},
		{"server defaults and foreign labels ignored", `
metadata: {name: s, uid: u, resourceVersion: "9", labels: {a: "1", other: "y"}}
spec:
  clusterIP: 10.0.0.1
  type: ClusterIP
  ports: [{port: 443, targetPort: 9443, protocol: TCP}]
  selector: {app: x}
status: {}
`, nil},
		{"label changed", `
metadata: {name: s, labels: {a: "2"}}
spec: {ports: [{port: 443, targetPort: 9443}], selector: {app: x}}
`, []string{"metadata.labels.a"}},
		{"list element changed", `
metadata: {name: s, labels: {a: "1"}}
spec: {ports: [{port: 443, targetPort: 8443}], selector: {app: x}}
`, []string{"spec.ports[0].targetPort"}},
		{"list element added by someone else", `
metadata: {name: s, labels: {a: "1"}}
spec: {ports: [{port: 443, targetPort: 9443}, {port: 80}], selector: {app: x}}
`, []string{"spec.ports"}},
		{"field removed", `
metadata: {name: s, labels: {a: "1"}}
spec: {ports: [{port: 443, targetPort: 9443}]}
`, []string{"spec.selector"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Drift(mustMap(t, desired), mustMap(t, tc.live))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Drift = %v, want %v", got, tc.want)
			}
		})
	}
}
