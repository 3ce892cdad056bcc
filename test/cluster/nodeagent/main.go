// Command nodeagent is the one program of the real test node's images
// (test/cluster NodeImages): the sandbox ("pause") image runs `nodeagent
// pause`, the stand-in workload image runs `nodeagent serve`, and a client
// pod runs `nodeagent get URL`. It is static, needs no shell and no files,
// so it runs as any user on a read-only root file system.
//
//	nodeagent pause              block until SIGTERM or SIGINT, then exit 0
//	nodeagent serve [ADDR]       HTTP on ADDR (default :8080): /healthz says
//	                             "ok", every other path answers "hello from
//	                             <hostname>"; exits 0 on SIGTERM
//	nodeagent get URL [WANT]     GET URL (5 s timeout, up to 30 tries 1 s
//	                             apart); exit 0 once a 200 body contains WANT
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nodeagent pause | serve [ADDR] | get URL [WANT]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "pause":
		<-ctx.Done()
	case "serve":
		addr := ":8080"
		if len(os.Args) > 2 {
			addr = os.Args[2]
		}
		err = serve(ctx, addr)
	case "get":
		if len(os.Args) < 3 {
			err = errors.New("get needs a URL")
			break
		}
		want := ""
		if len(os.Args) > 3 {
			want = os.Args[3]
		}
		err = get(ctx, os.Args[2], want)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeagent:", err)
		os.Exit(1)
	}
}

func serve(ctx context.Context, addr string) error {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello from "+host+"\n") })
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Println("nodeagent: serving on", addr)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func get(ctx context.Context, url, want string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	var last error
	for i := 0; i < 30; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
		resp, err := client.Get(url)
		if err != nil {
			last = err
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if err != nil {
			last = err
			continue
		}
		if resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
			fmt.Printf("nodeagent: %s answered: %s", url, body)
			return nil
		}
		last = fmt.Errorf("status %d, body %q", resp.StatusCode, body)
	}
	return fmt.Errorf("GET %s: %w", url, last)
}
