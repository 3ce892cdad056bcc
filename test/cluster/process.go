package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Process is a child process whose output goes to a log file. It dies with
// the test binary (Pdeathsig), so a killed `go test` leaks nothing.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartProcess runs bin with args, logging to <logDir>/<name>.log.
func StartProcess(name, logDir, bin string, args []string, env []string) (*Process, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and its error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) error {
	if ok, _ := p.Exited(); ok {
		return nil
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return nil
}

// Kill sends SIGKILL to the process group at once (no shutdown: a crash
// or an OOM kill) and waits for the end.
func (p *Process) Kill() {
	if ok, _ := p.Exited(); ok {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Tail returns the last n bytes of the process log, for failure messages.
func (p *Process) Tail(n int64) string {
	return tailFile(p.Log, n)
}

func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	_, _ = f.ReadAt(buf, off)
	return string(buf)
}

// Settle waits d after the start and fails, with the log's tail, if the
// process has already ended: a component with bad flags, a missing binary
// or kubeconfig exits at once. It returns ctx's error if ctx ends first.
func (p *Process) Settle(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return ctx.Err()
	}
	if done, err := p.Exited(); done {
		return fmt.Errorf("%s exited at start (%v); log tail:\n%s", p.Name, err, p.Tail(2000))
	}
	return nil
}

// exitErr is nil while p runs; once it has ended, a Permanent error naming
// p, how it ended and the last tail bytes of its log, for a Condition that
// waits on p.
func (p *Process) exitErr(tail int64) error {
	if done, err := p.Exited(); done {
		return Permanent(fmt.Errorf("%s exited (%v); log tail:\n%s", p.Name, err, p.Tail(tail)))
	}
	return nil
}

// ProbeOK is a Condition on p's health probe server: true once
// http://127.0.0.1:port<path> answers 200 OK (a refused or failed request
// is remembered and polling goes on), and a Permanent error with its log's
// tail once p has ended, so a wait on a process that died at start fails
// at once.
func (p *Process) ProbeOK(port int, path string) Condition {
	url := fmt.Sprintf("http://127.0.0.1:%d%s", port, path)
	return func(context.Context) (bool, error) {
		if done, perr := p.Exited(); done {
			return false, Permanent(fmt.Errorf("exited: %v\n%s", perr, p.Tail(3000)))
		}
		res, err := http.Get(url)
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, nil
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// MustFreePort is FreePort for tests: it fails t on error.
func MustFreePort(t testing.TB) int {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
