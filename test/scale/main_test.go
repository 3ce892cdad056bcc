// Package scale measures what NodeOversell costs the control plane, issue 19
// item 6, against a real kube-apiserver and etcd and the real oversell
// server (`hookwright oversell`, a child process behind its Service).
//
// The nodes are played by cluster.Heartbeater, which writes node status at
// the kubelet's rhythm (a GET from the API server's cache every
// nodeStatusUpdateFrequency, 10 s; a PATCH of nodes/status when the status
// changed or the 5 min report period passed) and renews each node's Lease
// every 10 s. They are not kwok nodes: kwok's own heartbeat stage would be
// a second status writer that a real node does not have, and nothing here
// runs pods.
//
// By default (`make test`) TestScale runs 50 nodes and asserts facts only:
// every node is amplified, a kubelet patch that only restates raw
// allocatable and heartbeat times is held (the stored node keeps its
// resourceVersion: etcd wrote nothing), a changed status goes through, a
// heartbeat still goes through once the stored one is --max-heartbeat-age
// old, and a ratio change reaches every node. With HOOKWRIGHT_SCALE=full
// (`make scale`) it measures 10, 100 and 1,000 nodes plain, amplified and
// amplified with holding, and writes _scale/report-full.md. The full run
// also runs the operator (`hookwright manager`, a child process, so its
// RSS is its own) reconciling each fleet's NodeOversell; its server has no
// pod here (no kube-controller-manager), so its webhook call fails and is
// ignored, and with ConfigLoaded never True it reconciles the NodeOversell
// again every 5 s (controllers/configloaded.go).
//
// TestFleetScale (fleet_scale_test.go) is issue 18's scale test of a
// SidecarInjector's fleet status: 1,000 pods in 10 namespaces by default,
// 10,000 in 100 with HOOKWRIGHT_SCALE=full, with the operator its own
// process; it asserts that the counts converge, that a template change
// makes every injected pod outdated and that a quiet fleet writes the CR
// never, and reports the times and the operator's RSS.
package scale

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/hookwright/hookwright/test/cluster"
)

var env *cluster.Cluster

func TestMain(m *testing.M) {
	ctx, cancel := context.WithCancel(context.Background())
	var err error
	opts := cluster.Options{Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }}
	if os.Getenv(sweepPodsEnv) != "" {
		// The pod sweep stores up to 162,500 pods of about 8 KiB
		// (injected): past etcd's default 2 GiB quota with bbolt's
		// overhead, after which every write fails (NOSPACE).
		opts.EtcdArgs = map[string][]string{"quota-backend-bytes": {strconv.Itoa(8 << 30)}}
		// kube-apiserver held about 85 KiB of resident memory per pod
		// at 50,000 (4.6 GiB, Go's default GOGC): bounded on this
		// shared machine. At 162,500 pods it holds 11.5 GiB: under a
		// 10 GiB soft limit it spent the takeover collecting garbage
		// (docs/scale.md, runs H and L), so large sweeps get 16 GiB.
		// make scale-pods SWEEP_APISERVER_MEMORY sets another.
		apiMem := "10GiB"
		if n, _ := strconv.Atoi(os.Getenv(sweepPodsEnv)); n >= 100000 {
			apiMem = "16GiB"
		}
		if v := os.Getenv(sweepAPIServerMemoryEnv); v != "" {
			apiMem = v
		}
		opts.APIServerEnv = []string{"GOMEMLIMIT=" + apiMem}
		// make scale-pods SWEEP_WATCHLIST=false: a server that does not
		// stream lists, for the index's paged path.
		if os.Getenv(sweepWatchListEnv) == "false" {
			opts.APIServerArgs = map[string][]string{"feature-gates": {"WatchList=false"}}
		}
	}
	env, err = cluster.New(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start cluster:", err)
		cancel()
		os.Exit(1)
	}
	code := m.Run()
	cancel()
	cluster.RemoveHookwrightBinary()
	if !env.StopChecked(os.Stderr) {
		code = 1
	}
	os.Exit(code)
}
