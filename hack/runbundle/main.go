// Command runbundle is behind `make bundle-image`, `make run-bundle`,
// `make run-bundle-upgrade` and `make cleanup-bundle`: docs/install.md's
// "OLM without Docker" path, `operator-sdk run bundle` by hand on a
// machine without a Docker engine.
//
//	runbundle image    build the operator image, the bundle image of
//	                   bundle/ (a derived one, in a temporary directory,
//	                   when VERSION or IMG differ from it), the empty
//	                   file-based index image and the images the catalog's
//	                   registry pod and OLM's unpack Job run, and push them
//	                   to IMAGE_REGISTRY
//	runbundle run      operator-sdk run bundle (the namespace labelled so
//	                   the registry pod is admitted); a failed run is
//	                   cleaned up so the next try starts clean
//	runbundle upgrade  operator-sdk run bundle-upgrade to VERSION
//	runbundle cleanup  operator-sdk cleanup, then OLM's leftover Operator
//	                   object
//
// Each command it runs is printed first, exactly (with the variables it
// took from the demo's env file in front). What the environment does not
// set (KUBECONFIG, SSL_CERT_FILE, IMAGE_REGISTRY) comes from the demo's
// env file (--demo-dir/env, hack/demoenv), so against a running
// `make demo` no variable is needed. Before acting it checks the cluster
// answers, serves OLM, holds no other install of hookwright and that the
// registry serves the images, and says what to run when not.
//
// It must not import the operator's packages (controllers, webhooks): it
// drives operator-sdk, kubectl and hack/ociimage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "runbundle:", err)
		os.Exit(1)
	}
}

// app is one invocation.
type app struct {
	s    Settings
	root string
	// commit is the operator's git commit (hack/build.sh).
	commit string
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: runbundle image|run|upgrade|cleanup [flags]")
	}
	fs := flag.NewFlagSet("runbundle "+args[0], flag.ContinueOnError)
	var a app
	demoDir := fs.String("demo-dir", "_demo", "the demo's directory; its env file gives what the environment does not set")
	fs.StringVar(&a.root, "root", ".", "repository root")
	fs.StringVar(&a.commit, "commit", "unknown", "the operator's git commit")
	fs.StringVar(&a.s.Namespace, "namespace", "hookwright-system", "the install namespace (BUNDLE_NAMESPACE)")
	fs.StringVar(&a.s.Version, "version", "0.1.0", "the bundle's version (VERSION)")
	fs.StringVar(&a.s.Operator, "img", "ghcr.io/hookwright/hookwright:v0.1.0", "the operator image's name (IMG)")
	fs.StringVar(&a.s.Bundle, "bundle-img", "ghcr.io/hookwright/hookwright-bundle:v0.1.0", "the bundle image's name (BUNDLE_IMG)")
	fs.DurationVar(&a.s.Timeout, "timeout", 5*time.Minute, "operator-sdk's --timeout (BUNDLE_TIMEOUT)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	root, err := filepath.Abs(a.root)
	if err != nil {
		return err
	}
	a.root = root
	envFile, demo, err := demoEnvFile(*demoDir)
	if err != nil {
		return err
	}
	if a.s, err = resolve(a.s, os.Getenv, demo); err != nil {
		return err
	}
	a.s.DemoEnv = envFile
	if len(a.s.FromDemo) > 0 {
		fmt.Printf("runbundle: %s from the demo's %s\n", strings.Join(a.s.FromDemo, ", "), envFile)
	}
	// This process reads them too (the image pushes and checks).
	for _, k := range a.s.FromDemo {
		if err := os.Setenv(k, a.s.value(k)); err != nil {
			return err
		}
	}
	switch args[0] {
	case "image":
		return a.image(ctx)
	case "run":
		return a.runBundle(ctx)
	case "upgrade":
		return a.upgrade(ctx)
	case "cleanup":
		k, err := connect(ctx, a.s)
		if err != nil {
			return err
		}
		return a.cleanup(ctx, k)
	}
	return fmt.Errorf("unknown command %q (want image, run, upgrade or cleanup)", args[0])
}

// runBundle is make run-bundle.
func (a *app) runBundle(ctx context.Context) error {
	n, err := a.s.names()
	if err != nil {
		return err
	}
	k, err := connect(ctx, a.s)
	if err != nil {
		return err
	}
	in, err := k.install(ctx, a.s.Namespace)
	if err != nil {
		return err
	}
	if err := in.checkRun(a.s.Namespace); err != nil {
		return err
	}
	if err := checkImages(ctx, a.s, n.Bundle, n.Index); err != nil {
		return err
	}
	exists, err := k.namespaceExists(ctx, a.s.Namespace)
	if err != nil {
		return err
	}
	fmt.Printf("runbundle: namespace %s enforces Pod Security %q: run bundle's registry pod has an init container without a securityContext and no runAsNonRoot, which \"restricted\" refuses\n",
		a.s.Namespace, pssLevel)
	for _, args := range a.s.namespaceArgs(exists) {
		if err := a.kubectl(ctx, args...); err != nil {
			return err
		}
	}
	start := time.Now()
	if err := a.sdk(ctx, a.s.sdkArgs("run", n)...); err != nil {
		// Clean up even when interrupted: a fresh context, bounded.
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		fmt.Printf("runbundle: run bundle failed after %s; removing what it left (CatalogSource, ConfigMaps, registry pod, OperatorGroup, Subscription, CRDs) so the next try starts clean\n",
			time.Since(start).Round(time.Second))
		// Its own timeout: BUNDLE_TIMEOUT may be what ran out.
		c := *a
		c.s.Timeout = 3 * time.Minute
		if cerr := c.cleanup(cctx, k); cerr != nil {
			return fmt.Errorf("run bundle: %w; and its cleanup failed too: %v (make cleanup-bundle retries it)", err, cerr)
		}
		return fmt.Errorf("run bundle: %w (cleaned up; fix the cause and run make run-bundle again)", err)
	}
	return a.report(ctx, k, csvName(a.s.Version), "installed", start)
}

// upgrade is make run-bundle-upgrade.
func (a *app) upgrade(ctx context.Context) error {
	n, err := a.s.names()
	if err != nil {
		return err
	}
	k, err := connect(ctx, a.s)
	if err != nil {
		return err
	}
	in, err := k.install(ctx, a.s.Namespace)
	if err != nil {
		return err
	}
	want := csvName(a.s.Version)
	sub, err := in.checkUpgrade(a.s.Namespace, want)
	if err != nil {
		return err
	}
	if err := checkImages(ctx, a.s, n.Bundle); err != nil {
		return err
	}
	start := time.Now()
	if err := a.sdk(ctx, a.s.sdkArgs("upgrade", n)...); err != nil {
		now := "unknown"
		if after, rerr := k.install(context.Background(), a.s.Namespace); rerr == nil {
			for _, s := range after.Subscriptions {
				if s.Namespace == a.s.Namespace {
					now = s.csv()
				}
			}
		}
		return fmt.Errorf("run bundle-upgrade from %s to %s: %w; the Subscription now names %s: retry make run-bundle-upgrade VERSION=%s, or start over with make cleanup-bundle (it %s) and make run-bundle",
			sub.csv(), want, err, now, a.s.Version, in.crdsGo())
	}
	return a.report(ctx, k, want, "upgraded from "+sub.csv()+" to", start)
}

// report prints the CSV's phase and the operator's pods after a run.
func (a *app) report(ctx context.Context, k *kube, csv, what string, start time.Time) error {
	phase, err := k.csvPhase(ctx, a.s.Namespace, csv)
	if err != nil {
		return err
	}
	pods, err := k.operatorPods(ctx, a.s.Namespace)
	if err != nil {
		return err
	}
	fmt.Printf("runbundle: %s %s in %s: CSV %s, operator pods %s\n", what, csv, time.Since(start).Round(100*time.Millisecond),
		phase, strings.Join(pods, ", "))
	return nil
}

// cleanup is make cleanup-bundle (and a failed run's cleanup).
func (a *app) cleanup(ctx context.Context, k *kube) error {
	in, err := k.install(ctx, a.s.Namespace)
	if err != nil {
		return err
	}
	found, err := in.checkCleanup(a.s.Namespace)
	if err != nil {
		return err
	}
	if found {
		fmt.Printf("runbundle: operator-sdk cleanup removes the Subscription, the CSV (with it the operator's Deployment, RBAC and Services), the CatalogSource (its registry pod and ConfigMaps) and the OperatorGroup, and %s\n", in.crdsGo())
		start := time.Now()
		if err := a.sdk(ctx, a.s.sdkArgs("cleanup", Names{})...); err != nil {
			return err
		}
		fmt.Printf("runbundle: operator-sdk cleanup done in %s\n", time.Since(start).Round(100*time.Millisecond))
		ogs, err := k.leftOperatorGroups(ctx, a.s.Namespace)
		if err != nil {
			return err
		}
		if len(ogs) > 0 {
			fmt.Printf("runbundle: operator-sdk cleanup looked for OperatorGroups before its Subscription was gone; no Subscription is left in %s, so they go too\n", a.s.Namespace)
			if err := a.kubectl(ctx, append([]string{"-n", a.s.Namespace, "delete", "operatorgroups.operators.coreos.com", "--ignore-not-found"}, ogs...)...); err != nil {
				return err
			}
		}
	}
	return a.deleteOLMOperator(ctx, k, found)
}

// deleteOLMOperator deletes OLM's Operator object of the package once no
// object is its component any more: OLM creates it for an install,
// re-creates it while an object carries its label, and never deletes it
// (operator-lifecycle-manager pkg/controller/operators/operator_controller.go);
// operator-sdk cleanup leaves it.
func (a *app) deleteOLMOperator(ctx context.Context, k *kube, cleaned bool) error {
	name := olmOperatorName(a.s.Namespace)
	var refs []string
	var exists bool
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var err error
		if refs, exists, err = k.olmOperatorRefs(ctx, a.s.Namespace); err != nil {
			return err
		}
		if !exists || len(refs) == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	switch {
	case !exists && !cleaned:
		fmt.Printf("runbundle: nothing of hookwright installed through OLM in %s: nothing to clean up\n", a.s.Namespace)
		return nil
	case !exists:
		return nil
	case len(refs) > 0:
		return fmt.Errorf("OLM's Operator %s still lists %s after 2 minutes: left as it is (OLM re-creates it while they carry its label)", name, strings.Join(refs, ", "))
	}
	fmt.Printf("runbundle: OLM's Operator object %s lists no component any more; OLM never deletes it\n", name)
	return a.kubectl(ctx, "delete", "operators.operators.coreos.com", name, "--ignore-not-found")
}

// sdk runs bin/operator-sdk with args, printed first.
func (a *app) sdk(ctx context.Context, args ...string) error {
	return a.command(ctx, "bin/operator-sdk", args)
}

// kubectl runs bin/k8s/kubectl with args, printed first.
func (a *app) kubectl(ctx context.Context, args ...string) error {
	return a.command(ctx, "bin/k8s/kubectl", args)
}

// command runs program (relative to the repository root) with args, its
// output to ours, after printing it exactly as a shell in the root would
// run it.
func (a *app) command(ctx context.Context, program string, args []string) error {
	fmt.Printf("$ %s\n", a.s.commandLine(program, args))
	cmd := exec.CommandContext(ctx, filepath.Join(a.root, program), args...)
	cmd.Dir = a.root
	cmd.Env = a.s.env(os.Environ())
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// On interruption the child gets SIGTERM (as from make), and a few
	// seconds to stop.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", filepath.Base(program), strings.Join(args[:min(2, len(args))], " "), err)
	}
	return nil
}
