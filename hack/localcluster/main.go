// Command localcluster is `make demo`: it starts the local control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
// nodes for the oversold pool), builds the images into a registry on
// 127.0.0.1, starts the real node system-0 (kubelet, containerd, runc, CNI,
// kube-proxy), deploys the operator from config/default (it runs its
// webhook servers there, all in real containers), applies config/samples,
// runs the end-to-end scenarios of test/e2e/scenarios and prints their
// report, then keeps everything running until SIGINT or SIGTERM (`make
// demo-down`), when it removes everything and checks nothing is left.
//
// It must not import the operator's packages: the operator runs in its own
// container, deployed through test/e2e/scenarios.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hookwright/hookwright/test/e2e/scenarios"
)

func main() {
	dir := flag.String("dir", "_demo", "directory for kubeconfig, logs, the node's state and sockets")
	run := flag.Bool("scenarios", true, "run the end-to-end scenarios and print their report")
	flag.Parse()
	if err := demo(*dir, *run); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func demo(dir string, run bool) error {
	ctrllog.SetLogger(logr.Discard()) // envtest's progress; our own lines go to stdout
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	e, err := scenarios.Start(ctx, scenarios.Options{Dir: abs, Logf: logf})
	if err != nil {
		if e != nil && e.Cluster != nil {
			for _, l := range e.Cluster.Leaks() {
				fmt.Println("leak:", l)
			}
		}
		return err
	}
	// make demo-down checks this namespace is gone.
	if err := os.WriteFile(filepath.Join(abs, "netns"), []byte(e.Node.Netns()+"\n"), 0o644); err != nil {
		return err
	}
	defer func() {
		e.Stop()
		// What make demo-down reports: anything the stack left behind.
		leaks := e.Cluster.Leaks()
		for _, l := range leaks {
			fmt.Println("leak:", l)
		}
		fmt.Printf("stopped; %d leaks\n", len(leaks))
	}()
	var report bytes.Buffer
	fmt.Fprintf(&report, "\n==== hookwright demo report ====\n")
	fmt.Fprintf(&report, "stack up in %s: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (%s), real node %s\n",
		time.Since(start).Round(100*time.Millisecond), joinNodes(), scenarios.SystemNode)
	for _, f := range e.Figures {
		fmt.Fprintf(&report, "figure: %s\n", f)
	}
	status := "pass"
	if run {
		passed, total := 0, len(scenarios.All)
		for _, s := range scenarios.All {
			fmt.Printf("running scenario %s\n", s.Name)
			sctx, cancel := s.Context(ctx)
			r := scenarios.Run(sctx, e, s)
			cancel()
			r.Write(&report)
			if r.Passed() {
				passed++
			}
			if r.Err != nil {
				status = "fail"
				fmt.Fprintf(&report, "stopped: the later scenarios build on this one\n")
				break
			}
		}
		if passed < total {
			status = "fail"
		}
		// The egress proxy sees CONNECT tunnels only (TLS is end to end and
		// the API server sends many admission requests over one tunnel), so
		// the figure is of tunnels, not of validated writes.
		fmt.Fprintf(&report, "(the operator's validating webhook, set up at manager start, checked every CR write: the config/samples and the scenarios'; CONNECT tunnels the API server opened to its Service: %d, each carrying many requests, so this is not a count of calls)\n",
			e.Cluster.Egress.Hits(e.ValidationTarget))
		fmt.Fprintf(&report, "%d of %d scenarios passed within the issue's bounds\n", passed, total)
	}
	fmt.Fprintf(&report, "\nThe cluster keeps running (make demo-down stops it):\n")
	fmt.Fprintf(&report, "  export KUBECONFIG=%s\n", e.Cluster.Kubeconfig)
	fmt.Fprintf(&report, "  bin/k8s/kubectl get nodes\n")
	fmt.Fprintf(&report, "  bin/k8s/kubectl get sidecarinjectors,nodeoversells\n")
	fmt.Fprintf(&report, "  bin/k8s/kubectl get pods -A -o wide\n")
	fmt.Fprintf(&report, "  bin/k8s/kubectl -n %s get deploy,pods,svc,secrets\n", scenarios.OperatorNamespace)
	fmt.Fprintf(&report, "  bin/k8s/kubectl -n %s logs deploy/hookwright-controller-manager\n", scenarios.OperatorNamespace)
	fmt.Fprintf(&report, "  bin/k8s/kubectl -n lab run demo --image=nginx:1.23-alpine --dry-run=server -o yaml\n")
	fmt.Fprintf(&report, "  bin/node/ctr --address %s -n k8s.io containers ls   # the node's containerd\n", e.Node.ContainerdSocket())
	fmt.Fprintf(&report, "  ip netns exec %s iptables-save -t nat   # kube-proxy's rules in the node's network namespace\n", e.Node.Netns())
	fmt.Fprintf(&report, "logs: %s/logs (control plane), %s (kubelet, containerd, kube-proxy)\n", abs, filepath.Dir(e.Node.Log("kubelet")))
	fmt.Print(report.String())
	if err := os.WriteFile(filepath.Join(abs, "report.txt"), report.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(abs, "status"), []byte(status+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(abs, "ready"), []byte(e.Cluster.Kubeconfig+"\n"), 0o644); err != nil {
		return err
	}
	<-ctx.Done()
	fmt.Println("stopping")
	return nil
}

func joinNodes() string {
	s := ""
	for i, n := range scenarios.PoolNodes {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s + " labelled pool=oversell, 4 CPU / 8Gi"
}
