package health

import (
	"fmt"
	"slices"
	"strings"
)

// Condition reasons of ConfigLoaded.
const (
	reasonGenerationServed = "GenerationServed"
	reasonServersLagging   = "ServersLagging"
	reasonNoReadyServers   = "NoReadyServers"
)

// PodServing is what one ready server pod reports for one CR: the
// generation it serves (0: none) or why it could not be read.
type PodServing struct {
	Pod        string
	Generation int64
	// Problem is "" when /configz was read; else a short, stable
	// description ("unreachable", "not loaded", "ignored: ...").
	Problem string
}

// ConfigLoadedState decides ConfigLoaded for generation gen from what the
// ready pods report: True when every one serves gen; served is the lowest
// generation served by a ready pod (0 with none).
func ConfigLoadedState(gen int64, pods []PodServing) (ok bool, reason, message string, served int64) {
	if len(pods) == 0 {
		return false, reasonNoReadyServers, fmt.Sprintf("no ready server pod to serve generation %d", gen), 0
	}
	slices.SortFunc(pods, func(a, b PodServing) int { return strings.Compare(a.Pod, b.Pod) })
	var lag []string
	for i, p := range pods {
		if i == 0 || p.Generation < served {
			served = p.Generation
		}
		switch {
		case p.Problem != "" && p.Generation != gen:
			lag = append(lag, fmt.Sprintf("%s (%s)", p.Pod, p.Problem))
		case p.Generation != gen:
			lag = append(lag, fmt.Sprintf("%s (generation %d)", p.Pod, p.Generation))
		}
	}
	if len(lag) == 0 {
		return true, reasonGenerationServed, fmt.Sprintf("%d of %d ready server pods serve generation %d", len(pods), len(pods), gen), served
	}
	return false, reasonServersLagging, fmt.Sprintf("%d of %d ready server pods do not serve generation %d: %s",
		len(lag), len(pods), gen, Summarize(lag, 5)), served
}
