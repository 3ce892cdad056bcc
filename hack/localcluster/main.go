// Command localcluster runs the test harness's local control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kwok nodes)
// until it gets SIGINT or SIGTERM. `make demo` starts it in the background.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hookwright/hookwright/test/cluster"
)

func main() {
	dir := flag.String("dir", "_demo", "directory for kubeconfig, logs and sockets")
	nodes := flag.Int("nodes", 3, "number of kwok nodes (label pool=oversell, 4 CPU / 8Gi allocatable)")
	flag.Parse()
	if err := run(*dir, *nodes); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run(dir string, n int) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	specs := make([]cluster.NodeSpec, n)
	for i := range specs {
		specs[i] = cluster.NodeSpec{Name: fmt.Sprintf("kwok-node-%d", i), CPU: "4", Memory: "8Gi", Labels: map[string]string{"pool": "oversell"}}
	}
	start := time.Now()
	c, err := cluster.New(ctx, cluster.Options{
		Dir:               abs,
		ControllerManager: true,
		Scheduler:         true,
		Nodes:             specs,
		Logf:              func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	defer c.Stop()
	fmt.Printf("local control plane ready in %s\n", time.Since(start).Round(time.Millisecond))
	fmt.Printf("kubeconfig: %s\n", c.Kubeconfig)
	if err := os.WriteFile(filepath.Join(abs, "ready"), []byte(c.Kubeconfig+"\n"), 0o644); err != nil {
		return err
	}
	<-ctx.Done()
	fmt.Println("stopping")
	return nil
}
