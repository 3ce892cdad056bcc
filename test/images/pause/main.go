//go:build linux

// Command pause is the process of containerd's pod sandbox image (built into
// registry.k8s.io/pause by hack/ociimage). As the sandbox's first process
// it holds the pod's namespaces open, exits 0 on SIGTERM or SIGINT (the
// runtime's stop), and reaps zombies when the pod shares one PID namespace
// (shareProcessNamespace: true makes it PID 1 for every container), like
// Kubernetes' build/pause/linux/pause.c.
//
// It runs inside an image: it imports the standard library only.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is printed by -v, as the upstream pause prints its own.
const version = "hookwright-pause 1.0"

func main() {
	if len(os.Args) > 1 {
		if os.Args[1] == "-v" {
			fmt.Println(version)
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "pause: unexpected arguments %q (only -v)\n", os.Args[1:])
		os.Exit(2)
	}
	// Become the reaper of orphaned descendants even when not PID 1 (a
	// sandbox without its own PID namespace); as PID 1 this is a no-op.
	_ = setChildSubreaper()
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	// Said once the handlers are in place: a stop signal from now on is
	// an exit 0 (before, the Go runtime's default would kill the process).
	fmt.Fprintln(os.Stderr, "pause: waiting for SIGTERM or SIGINT")
	os.Exit(run(sigs, reap))
}

// run blocks until SIGTERM or SIGINT arrives on sigs and returns the exit
// code (0); every SIGCHLD calls reap first.
func run(sigs <-chan os.Signal, reap func()) int {
	for s := range sigs {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: shutting down, got signal: %v\n", s)
		return 0
	}
	return 0
}

// reap collects every exited child without blocking. Signals coalesce, so
// one SIGCHLD may stand for many exits: loop until none is left.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

// setChildSubreaper is prctl(PR_SET_CHILD_SUBREAPER, 1).
func setChildSubreaper() error {
	const prSetChildSubreaper = 36
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
