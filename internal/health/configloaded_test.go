package health

import (
	"testing"
)

func TestConfigLoadedState(t *testing.T) {
	ok, reason, msg, served := ConfigLoadedState(5, []PodServing{{Pod: "b", Generation: 5}, {Pod: "a", Generation: 5}})
	if !ok || reason != reasonGenerationServed || served != 5 || msg != "2 of 2 ready server pods serve generation 5" {
		t.Fatalf("all served: %t %s %q %d", ok, reason, msg, served)
	}
	ok, reason, msg, served = ConfigLoadedState(5, []PodServing{{Pod: "b", Generation: 4}, {Pod: "a", Generation: 5}, {Pod: "c", Problem: "unreachable"}})
	if ok || reason != reasonServersLagging || served != 0 || msg != "2 of 3 ready server pods do not serve generation 5: b (generation 4), c (unreachable)" {
		t.Fatalf("lagging: %t %s %q %d", ok, reason, msg, served)
	}
	if ok, reason, _, _ := ConfigLoadedState(5, nil); ok || reason != reasonNoReadyServers {
		t.Fatalf("no pods: %t %s", ok, reason)
	}
}
