// Command standin plays the workload images our scenarios name, since no
// public registry is reachable here (hack/ociimage builds one image per
// role, installing this binary under the role's name). The role comes from
// the name it runs as (argv[0]'s base name) or, run as "standin", from its
// first argument:
//
//	nginx        HTTP on :80 (nginx:1.23-alpine; its args are nginx's -g ...)
//	proxy        run [--log-level=L] [--service-cluster=S]: the sample
//	             SidecarInjector's sidecar; admin HTTP on :15000 (/ready,
//	             /stats/prometheus) and a TCP listener on :15001
//	proxy-init   redirect --proxy-port P --proxy-uid U [--exclude-inbound-ports L]:
//	             checks its arguments, changes nothing, exits 0
//	log-shipper  --endpoint URL [--format F]: waits for SIGTERM
//	serve        [--port P]: a plain workload (test/node's pods); HTTP on P
//	             (default 8080): /healthz says "ok", every other path
//	             "hello from <hostname>"
//	get          [--tries N] [--interval D] URL [WANT]: an HTTP client pod;
//	             GETs URL (5 s timeout) up to N times (30) D apart (1s) and
//	             exits 0 once a 200 body contains WANT
//	api          [--tries N] [--interval D] PATH STATUS...: an in-cluster API
//	             client (client-go's rest.InClusterConfig: the kubernetes
//	             Service, the pod's ServiceAccount token and CA); GETs each
//	             PATH until it answers its STATUS and prints each answer
//	burn         [--port P] [--threads N] [--off]: a CPU burner (the
//	             usage-aware NodeOversell's tests): N goroutines (1) spin
//	             while burning, from the start unless --off; HTTP on P
//	             (8080): /on and /off switch it, /healthz says "ok"; its
//	             usage is bounded by the container's cpu limit
//
// Every server exits 0 on SIGTERM or SIGINT; bad arguments, and a get that
// never saw its answer, exit 2.
//
// It runs inside images: it imports the standard library only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	role, args := roleOf(os.Args)
	if err := runRole(ctx, role, args, listenAll, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
		os.Exit(2)
	}
}

// roleOf returns the role and its arguments from argv.
func roleOf(argv []string) (string, []string) {
	if len(argv) == 0 {
		return "", nil
	}
	role := filepath.Base(argv[0])
	if role == "standin" && len(argv) > 1 {
		return argv[1], argv[2:]
	}
	return role, argv[1:]
}

// listenFunc opens the listener for a role's TCP port; tests swap in
// loopback listeners on free ports.
type listenFunc func(port int) (net.Listener, error)

// listenAll listens on every address of the pod, as the real servers do.
func listenAll(port int) (net.Listener, error) {
	return net.Listen("tcp", ":"+strconv.Itoa(port))
}

// runRole runs one role until ctx ends (servers) or its work is done.
// Bad arguments are an error (exit 2), as the real programs would refuse them.
func runRole(ctx context.Context, role string, args []string, listen listenFunc, out io.Writer) error {
	switch role {
	case "nginx":
		fs := newFlags("nginx")
		fs.String("g", "", "global directives (accepted and ignored)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return serve(ctx, out, listen, map[int]http.Handler{80: nginxHandler()})
	case "proxy":
		if len(args) == 0 || args[0] != "run" {
			return fmt.Errorf("want the subcommand run, got %q", args)
		}
		fs := newFlags("proxy run")
		fs.String("log-level", "info", "log level")
		cluster := fs.String("service-cluster", "", "service cluster name")
		admin := fs.Int("admin-port", 15000, "admin HTTP port (/ready)")
		proxy := fs.Int("proxy-port", 15001, "proxy port")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		fmt.Fprintf(out, "proxy: service cluster %q, admin :%d, proxy :%d\n", *cluster, *admin, *proxy)
		if *admin == *proxy {
			return fmt.Errorf("--admin-port and --proxy-port are both %d", *admin)
		}
		return serve(ctx, out, listen, map[int]http.Handler{
			*admin: proxyAdminHandler(*cluster),
			*proxy: proxyHandler(),
		})
	case "proxy-init":
		if len(args) == 0 || args[0] != "redirect" {
			return fmt.Errorf("want the subcommand redirect, got %q", args)
		}
		fs := newFlags("proxy-init redirect")
		port := fs.Int("proxy-port", 0, "port the proxy listens on")
		uid := fs.Int("proxy-uid", -1, "uid the proxy runs as")
		exclude := fs.String("exclude-inbound-ports", "", "comma-separated ports")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *port < 1 || *port > 65535 {
			return fmt.Errorf("--proxy-port %d: want 1-65535", *port)
		}
		if *uid < 0 {
			return errors.New("--proxy-uid is required")
		}
		if _, err := ports(*exclude); err != nil {
			return err
		}
		// A stand-in: traffic is not redirected, so the app's own port keeps
		// answering and the proxy needs to forward nothing.
		fmt.Fprintf(out, "proxy-init: would redirect inbound traffic to :%d for all but uid %d (excluded ports %q)\n", *port, *uid, *exclude)
		return nil
	case "log-shipper":
		fs := newFlags("log-shipper")
		endpoint := fs.String("endpoint", "", "where logs go")
		format := fs.String("format", "json", "json or text")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if *endpoint == "" {
			return errors.New("--endpoint is required")
		}
		if *format != "json" && *format != "text" {
			return fmt.Errorf("--format %q: want json or text", *format)
		}
		fmt.Fprintf(out, "log-shipper: would ship %s logs to %s\n", *format, *endpoint)
		<-ctx.Done()
		return nil
	case "serve":
		fs := newFlags("serve")
		port := fs.Int("port", 8080, "HTTP port")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return serve(ctx, out, listen, map[int]http.Handler{*port: workloadHandler()})
	case "get":
		fs := newFlags("get")
		tries := fs.Int("tries", 30, "attempts")
		interval := fs.Duration("interval", time.Second, "pause between attempts")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() < 1 || fs.NArg() > 2 || *tries < 1 {
			return errors.New("want [--tries N>0] [--interval D] URL [WANT]")
		}
		return getUntil(ctx, out, fs.Arg(0), fs.Arg(1), *tries, *interval)
	case "api":
		fs := newFlags("api")
		tries := fs.Int("tries", 30, "attempts per path")
		interval := fs.Duration("interval", time.Second, "pause between attempts")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 || fs.NArg()%2 != 0 || *tries < 1 {
			return errors.New("want [--tries N>0] [--interval D] PATH STATUS [PATH STATUS]...")
		}
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return err
		}
		client, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return err
		}
		for i := 0; i < fs.NArg(); i += 2 {
			want, err := strconv.Atoi(fs.Arg(i + 1))
			if err != nil {
				return fmt.Errorf("status %q: %w", fs.Arg(i+1), err)
			}
			if err := apiUntil(ctx, out, client, cfg.Host+fs.Arg(i), want, *tries, *interval); err != nil {
				return err
			}
		}
		return nil
	case "burn":
		fs := newFlags("burn")
		port := fs.Int("port", 8080, "HTTP port")
		threads := fs.Int("threads", 1, "spinning goroutines")
		off := fs.Bool("off", false, "start idle")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if *threads < 1 || *threads > 64 {
			return fmt.Errorf("--threads %d: want 1-64", *threads)
		}
		b := newBurner(ctx, *threads, !*off)
		return serve(ctx, out, listen, map[int]http.Handler{*port: b.handler()})
	default:
		return fmt.Errorf("unknown role %q (want nginx, proxy, proxy-init, log-shipper, serve, get, api or burn)", role)
	}
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func ports(list string) ([]int, error) {
	var ps []int
	for p := range strings.SplitSeq(list, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("port %q: want 1-65535", p)
		}
		ps = append(ps, n)
	}
	return ps, nil
}

func nginxHandler() http.Handler {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "hookwright stand-in nginx on %s\n", host)
	})
	return mux
}

func proxyAdminHandler(cluster string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "LIVE")
	})
	mux.HandleFunc("GET /stats/prometheus", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE standin_up gauge\nstandin_up{service_cluster=%q} 1\n", cluster)
	})
	return mux
}

func workloadHandler() http.Handler {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "hello from %s\n", host) })
	return mux
}

// getUntil GETs url until a 200 answer's body contains want (tries times,
// interval apart), and prints that body on out.
func getUntil(ctx context.Context, out io.Writer, url, want string, tries int, interval time.Duration) error {
	// A new connection per try: through a Service, each is balanced anew
	// (a kept-alive one would stay on the first endpoint).
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	err := getRetry(ctx, client, url, 1<<16, tries, interval, func(status int, body []byte) bool {
		if status != http.StatusOK || !strings.Contains(string(body), want) {
			return false
		}
		fmt.Fprintf(out, "get: %s answered: %s", url, body)
		return true
	})
	if err != nil {
		return fmt.Errorf("GET %s: no 200 answer containing %q after %d tries: %w", url, want, tries, err)
	}
	return nil
}

// apiUntil GETs url with client until it answers status want (a transport
// error is retried: kube-proxy may not have the kubernetes Service's rule
// yet), and prints the answer on out.
func apiUntil(ctx context.Context, out io.Writer, client *http.Client, url string, want, tries int, interval time.Duration) error {
	err := getRetry(ctx, client, url, 1<<12, tries, interval, func(status int, body []byte) bool {
		if status != want {
			return false
		}
		fmt.Fprintf(out, "api: GET %s: %d %s\n", url, status, strings.Join(strings.Fields(string(body)), " "))
		return true
	})
	if err != nil {
		return fmt.Errorf("GET %s: no %d answer after %d tries: %w", url, want, tries, err)
	}
	return nil
}

// getRetry GETs url (reading at most limit bytes of each body) up to tries
// times, interval apart, until done accepts an answer; it returns the last
// failure otherwise.
func getRetry(ctx context.Context, client *http.Client, url string, limit int64, tries int, interval time.Duration, done func(status int, body []byte) bool) error {
	var last error
	for i := 0; i < tries; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(interval):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
		resp.Body.Close()
		if err != nil {
			last = err
			continue
		}
		if done(resp.StatusCode, body) {
			return nil
		}
		last = fmt.Errorf("status %d, body %q", resp.StatusCode, body)
	}
	return last
}

func proxyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hookwright stand-in proxy")
	})
}

// serve listens on every port first (so a bind error fails the start, as
// it would for the real server), reports them on out, and serves until ctx
// ends.
func serve(ctx context.Context, out io.Writer, listen listenFunc, handlers map[int]http.Handler) error {
	var servers []*http.Server
	errs := make(chan error, len(handlers))
	for port, h := range handlers {
		ln, err := listen(port)
		if err != nil {
			for _, s := range servers {
				_ = s.Close()
			}
			return err
		}
		s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, s)
		fmt.Fprintf(out, "port %d listening on %s\n", port, ln.Addr())
		go func() { errs <- s.Serve(ln) }()
	}
	select {
	case <-ctx.Done():
	case err := <-errs:
		for _, s := range servers {
			_ = s.Close()
		}
		return err
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(shutdown)
	}
	return nil
}
