package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func (c *Cluster) kubeconfigArgs() []string {
	return []string{"--kubeconfig=" + c.Kubeconfig}
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	bin, err := c.componentPath("kube-controller-manager")
	if err != nil {
		return err
	}
	certs := c.APIServerCertDir()
	args := append(c.kubeconfigArgs(),
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file="+filepath.Join(certs, pkiSAKey),
		// kube-root-ca.crt in every namespace: what in-cluster clients trust.
		"--root-ca-file="+filepath.Join(certs, pkiCA),
		"--controllers=*,-node-ipam-controller,-persistentvolume-binder-controller,-persistentvolume-attach-detach-controller",
		// Simulated nodes: give up on a silent node quickly but do not evict
		// the moment a heartbeat is late.
		"--node-monitor-grace-period=60s",
		"--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
		"--kube-api-qps=200", "--kube-api-burst=400",
		"--v=1",
	)
	return c.startAndWait(ctx, "kube-controller-manager", bin, args, func(ctx context.Context) (bool, error) {
		// The serviceaccount controller creates "default" in every namespace.
		sa := &corev1.ServiceAccount{}
		err := c.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "default"}, sa)
		return err == nil, err
	})
}

func (c *Cluster) startScheduler(ctx context.Context) error {
	bin, err := c.componentPath("kube-scheduler")
	if err != nil {
		return err
	}
	args := append(c.kubeconfigArgs(),
		"--leader-elect=false",
		"--secure-port=0",
		"--kube-api-qps=200", "--kube-api-burst=400",
		"--v=1",
	)
	return c.startAndWait(ctx, "kube-scheduler", bin, args, nil)
}

func (c *Cluster) startAndWait(ctx context.Context, name, bin string, args []string, ready func(context.Context) (bool, error)) error {
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s not built: run hack/tools.sh (make tools): %w", bin, err)
	}
	c.opts.Logf("cluster: starting %s", name)
	p, err := StartProcess(name, filepath.Join(c.Dir, "logs"), bin, args, nil)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	if err := p.Settle(ctx, 500*time.Millisecond); err != nil {
		return err
	}
	if ready == nil {
		return nil
	}
	if err := WaitFor(ctx, 60*time.Second, name+" ready", func(ctx context.Context) (bool, error) {
		if err := p.exitErr(1500); err != nil {
			return false, err
		}
		return ready(ctx)
	}); err != nil {
		return err
	}
	return nil
}
