package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// loopback hands out 127.0.0.1 listeners on free ports and remembers which
// role port each one stands for.
type loopback struct {
	mu    sync.Mutex
	addrs map[int]string
	ready chan struct{}
	want  int
}

func newLoopback(want int) *loopback {
	return &loopback{addrs: map[int]string{}, ready: make(chan struct{}), want: want}
}

func (l *loopback) listen(port int) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addrs[port] = ln.Addr().String()
	if len(l.addrs) == l.want {
		close(l.ready)
	}
	return ln, nil
}

func (l *loopback) addr(t *testing.T, port int) string {
	t.Helper()
	select {
	case <-l.ready:
	case <-time.After(2 * time.Minute):
		t.Fatal("timed out waiting for the listeners")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.addrs[port]
	if !ok {
		t.Fatalf("nothing listens for port %d (have %v)", port, l.addrs)
	}
	return a
}

// start runs a server role and returns its listeners and a stop function
// that checks it ended cleanly (the SIGTERM path: ctx ends, exit 0).
func start(t *testing.T, role string, args []string, ports int) (*loopback, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lb := newLoopback(ports)
	done := make(chan error, 1)
	go func() { done <- runRole(ctx, role, args, lb.listen, io.Discard) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s ended with %v, want nil", role, err)
		}
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Logf("%s ended with %v after the test", role, err)
			}
		default:
		}
	})
	return lb, stop
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestNginxServesPort80(t *testing.T) {
	lb, stop := start(t, "nginx", []string{"-g", "daemon off;"}, 1)
	code, body := get(t, "http://"+lb.addr(t, 80)+"/")
	if code != 200 || !strings.Contains(body, "stand-in nginx") {
		t.Fatalf("GET / = %d %q", code, body)
	}
	if code, _ := get(t, "http://"+lb.addr(t, 80)+"/missing"); code != 404 {
		t.Errorf("GET /missing = %d, want 404", code)
	}
	stop()
}

// The sample SidecarInjector runs the proxy with `run --log-level=...
// --service-cluster=...` and probes GET /ready on its admin port 15000.
func TestProxyServesReadinessOnAdminPort(t *testing.T) {
	lb, stop := start(t, "proxy", []string{"run", "--log-level=info", "--service-cluster=test"}, 2)
	if code, body := get(t, "http://"+lb.addr(t, 15000)+"/ready"); code != 200 || body != "LIVE\n" {
		t.Fatalf("GET :15000/ready = %d %q", code, body)
	}
	if code, body := get(t, "http://"+lb.addr(t, 15000)+"/stats/prometheus"); code != 200 || !strings.Contains(body, `service_cluster="test"`) {
		t.Errorf("GET :15000/stats/prometheus = %d %q", code, body)
	}
	if code, _ := get(t, "http://"+lb.addr(t, 15001)+"/"); code != 200 {
		t.Errorf("GET :15001/ = %d", code)
	}
	stop()
}

func TestProxyPortsFromFlags(t *testing.T) {
	lb, stop := start(t, "proxy", []string{"run", "--admin-port=9901", "--proxy-port=9902"}, 2)
	if code, _ := get(t, "http://"+lb.addr(t, 9901)+"/ready"); code != 200 {
		t.Fatalf("GET :9901/ready = %d", code)
	}
	stop()
}

func TestRoleArguments(t *testing.T) {
	for _, tc := range []struct {
		role    string
		args    []string
		wantErr string
	}{
		{"proxy-init", []string{"redirect", "--proxy-port", "15001", "--proxy-uid", "1337"}, ""},
		{"proxy-init", []string{"redirect", "--proxy-port", "15001", "--proxy-uid", "1337", "--exclude-inbound-ports", "8080, 9090"}, ""},
		{"proxy-init", []string{"redirect", "--proxy-port", "0", "--proxy-uid", "1337"}, "--proxy-port 0"},
		{"proxy-init", []string{"redirect", "--proxy-port", "15001"}, "--proxy-uid is required"},
		{"proxy-init", []string{"redirect", "--proxy-port", "15001", "--proxy-uid", "1", "--exclude-inbound-ports", "80,x"}, `port "x"`},
		{"proxy-init", []string{"--proxy-port", "15001"}, "subcommand redirect"},
		{"proxy-init", []string{"redirect", "--bogus"}, "flag provided but not defined"},
		{"proxy", nil, "subcommand run"},
		{"proxy", []string{"run", "--admin-port=1", "--proxy-port=1"}, "both 1"},
		{"log-shipper", []string{"--format", "json"}, "--endpoint is required"},
		{"log-shipper", []string{"--endpoint", "http://x", "--format", "xml"}, `--format "xml"`},
		{"httpd", nil, `unknown role "httpd"`},
	} {
		t.Run(tc.role+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			err := runRole(context.Background(), tc.role, tc.args, func(int) (net.Listener, error) {
				return nil, errors.New("no listening in this test")
			}, io.Discard)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestLogShipperWaitsForStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runRole(ctx, "log-shipper", []string{"--endpoint", "http://logs:9880"}, nil, io.Discard)
	}()
	select {
	case err := <-done:
		t.Fatalf("log-shipper returned %v before its stop", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRoleOf(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		role string
		args int
	}{
		{[]string{"/usr/local/bin/proxy", "run"}, "proxy", 1},
		{[]string{"/usr/sbin/nginx", "-g", "daemon off;"}, "nginx", 2},
		{[]string{"./standin", "proxy-init", "redirect"}, "proxy-init", 1},
		{[]string{"standin"}, "standin", 0},
		{nil, "", 0},
	} {
		role, args := roleOf(tc.argv)
		if role != tc.role || len(args) != tc.args {
			t.Errorf("roleOf(%q) = %q %q", tc.argv, role, args)
		}
	}
}

// The images install the binary under the role's name: check the real
// argv[0] dispatch and exit codes of the built program.
func TestBinaryDispatchesOnItsName(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "proxy-init")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "redirect", "--proxy-port", "15001", "--proxy-uid", "1337").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("would redirect")) {
		t.Fatalf("proxy-init redirect: %v %q, want exit 0", err, out)
	}
	var exit *exec.ExitError
	out, err = exec.Command(bin, "redirect").CombinedOutput()
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !bytes.HasPrefix(out, []byte("proxy-init: ")) {
		t.Fatalf("proxy-init redirect without flags: %v %q, want exit 2 with a message", err, out)
	}
}

// test/node's workload: readiness on /healthz, its hostname everywhere else.
func TestServeAnswersWithItsHostname(t *testing.T) {
	lb, stop := start(t, "serve", nil, 1)
	if code, body := get(t, "http://"+lb.addr(t, 8080)+"/healthz"); code != 200 || body != "ok" {
		t.Fatalf("GET /healthz = %d %q", code, body)
	}
	host, _ := os.Hostname()
	if code, body := get(t, "http://"+lb.addr(t, 8080)+"/any/path"); code != 200 || body != "hello from "+host+"\n" {
		t.Errorf("GET /any/path = %d %q, want hello from %s", code, body, host)
	}
	stop()
	lb, stop = start(t, "serve", []string{"--port=9000"}, 1)
	if code, _ := get(t, "http://"+lb.addr(t, 9000)+"/healthz"); code != 200 {
		t.Errorf("GET :9000/healthz = %d", code)
	}
	stop()
}

// get is the client pod of test/node's Service test: it retries until the
// answer it waits for comes, and fails (exit 2) when it never does.
func TestGetWaitsForItsAnswer(t *testing.T) {
	var calls sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Lock()
		defer calls.Unlock()
		if n++; n < 3 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "hello from server")
	}))
	defer srv.Close()
	var out bytes.Buffer
	err := runRole(context.Background(), "get", []string{"--interval=10ms", srv.URL + "/", "hello from server"}, nil, &out)
	if err != nil || !strings.Contains(out.String(), "answered: hello from server") {
		t.Fatalf("get: %v %q", err, out.String())
	}
	if n != 3 {
		t.Errorf("%d requests, want 3 (two 503s, then the answer)", n)
	}
	err = runRole(context.Background(), "get", []string{"--tries=2", "--interval=10ms", srv.URL + "/", "hello from elsewhere"}, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "after 2 tries") {
		t.Errorf("get of an answer that never comes: %v, want an error after 2 tries", err)
	}
	for _, args := range [][]string{nil, {"a", "b", "c"}, {"--tries=0", srv.URL}} {
		if err := runRole(context.Background(), "get", args, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "want [--tries") {
			t.Errorf("get %q: %v, want a usage error", args, err)
		}
	}
}

// burn spins while on and idles while off; /on and /off switch it.
func TestBurnSwitches(t *testing.T) {
	lb, stop := start(t, "burn", []string{"--off"}, 1)
	defer stop()
	base := "http://" + lb.addr(t, 8080)
	if _, body := get(t, base+"/"); !strings.HasPrefix(body, "burning=false spins=0") {
		t.Fatalf("started --off: %q", body)
	}
	if code, _ := get(t, base+"/on"); code != 200 {
		t.Fatalf("/on = %d", code)
	}
	var body string
	for i := 0; i < 200; i++ {
		if _, body = get(t, base+"/"); strings.HasPrefix(body, "burning=true") && !strings.Contains(body, "spins=0\n") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.HasPrefix(body, "burning=true") || strings.Contains(body, "spins=0\n") {
		t.Fatalf("after /on: %q", body)
	}
	get(t, base+"/off")
	// A round in flight finishes; then the count stops.
	var a, b string
	for i := 0; i < 200; i++ {
		_, a = get(t, base+"/")
		time.Sleep(10 * time.Millisecond)
		if _, b = get(t, base+"/"); a == b {
			break
		}
	}
	if !strings.HasPrefix(a, "burning=false") || a != b {
		t.Fatalf("after /off still spinning: %q then %q", a, b)
	}
}
