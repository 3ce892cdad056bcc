package listener

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/hookwright/hookwright/webhooks/serving"
)

// The server's timeouts from the flag defaults: reading and writing are
// bounded by the request timeout, while an idle connection outlives the
// API server's 90 s keep-alive (http.DefaultTransport's IdleConnTimeout,
// which client-go's transport inherits), so the API server always closes
// first and never reuses a connection the server is closing. A 30 s idle
// timeout made 3 of 6000 reviews fail with EOF in the injector-process soak.
func TestServerTimeoutsFromFlags(t *testing.T) {
	var o Options
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	srv := o.httpServer(context.Background(), http.NotFoundHandler())
	if srv.ReadHeaderTimeout != serving.DefaultTimeout || srv.ReadTimeout != serving.DefaultTimeout || srv.WriteTimeout <= srv.ReadTimeout {
		t.Errorf("read header %v, read %v, write %v: want %v, %v and a little more", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, serving.DefaultTimeout, serving.DefaultTimeout)
	}
	clientIdle := http.DefaultTransport.(*http.Transport).IdleConnTimeout
	if srv.IdleTimeout <= clientIdle {
		t.Errorf("idle timeout %v, want above the API server client's %v", srv.IdleTimeout, clientIdle)
	}
	if srv.TLSNextProto == nil || len(srv.TLSNextProto) != 0 {
		t.Errorf("TLSNextProto %v: want an empty map (HTTP/2 off)", srv.TLSNextProto)
	}
	if srv.MaxHeaderBytes != 64<<10 {
		t.Errorf("MaxHeaderBytes %d", srv.MaxHeaderBytes)
	}
	o.RequestTimeout, o.IdleTimeout = 5*time.Second, time.Second
	if srv := o.httpServer(context.Background(), nil); srv.ReadTimeout != 5*time.Second || srv.IdleTimeout != time.Second {
		t.Errorf("options not applied: read %v idle %v", srv.ReadTimeout, srv.IdleTimeout)
	}
}
