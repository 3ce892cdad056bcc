//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRunReapsOnSIGCHLDAndStopsOnSIGTERM(t *testing.T) {
	sigs := make(chan os.Signal, 3)
	sigs <- syscall.SIGCHLD
	sigs <- syscall.SIGCHLD
	sigs <- syscall.SIGTERM
	reaped := 0
	if code := run(sigs, func() { reaped++ }); code != 0 || reaped != 2 {
		t.Fatalf("run = %d after %d reaps, want 0 after 2", code, reaped)
	}
}

// A child nobody waits for stays a zombie until reap collects it.
func TestReapCollectsZombies(t *testing.T) {
	var pids []int
	for range 3 {
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		waitFor(t, func() bool { return procState(pid) == "Z" }, "child %d to become a zombie", pid)
	}
	reap()
	for _, pid := range pids {
		if s := procState(pid); s != "" {
			t.Errorf("child %d still in state %q after reap", pid, s)
		}
	}
}

func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "pause")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(bin)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Signal only once the handler is installed (pause says so):
			// before, the runtime's default would kill it.
			line, err := bufio.NewReader(stderr).ReadString('\n')
			if err != nil || !strings.Contains(line, "waiting") {
				t.Fatalf("pause's first line %q, %v", line, err)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("pause after %v: %v, want exit 0", sig, err)
			}
		})
	}

	out, err := exec.Command(bin, "-v").Output()
	if err != nil || !bytes.HasPrefix(out, []byte("hookwright-pause")) {
		t.Errorf("pause -v = %q, %v", out, err)
	}
	var exit *exec.ExitError
	if err := exec.Command(bin, "extra").Run(); !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("pause extra = %v, want exit 2", err)
	}
}

// procState is the state letter of /proc/<pid>/stat, "" once it is gone.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command sits in parentheses and may hold spaces: the state
	// follows the last ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// waitFor polls cond; the deadline only bounds a hang, it asserts no speed.
func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for "+format, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
