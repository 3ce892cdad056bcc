package sidecar

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/hookwright/hookwright/webhooks/serving"
	"github.com/hookwright/hookwright/webhooks/serving/servingtest"
)

// Soak parameters of issue 11 §2: slow clients each declaring a 3 MiB body
// and trickling it, and valid reviews at a steady rate, against one server
// with the production envelope, for a minute.
const (
	soakSlowClients  = 200
	soakValidPerSec  = 100
	soakDuration     = 60 * time.Second
	soakReviewTimout = 10 * time.Second // the SidecarInjector's default timeoutSeconds
	// soakMemoryLimit is the server Deployment's memory limit
	// (controllers.DefaultResources).
	soakMemoryLimit = 256 << 20
)

type soakStats struct {
	mu        sync.Mutex
	latencies []time.Duration
	failures  []string

	slowOpened, slowDialErrors atomic.Int64
	slowLongest                atomic.Int64 // nanoseconds from dial to the server's answer
	slowStatus                 sync.Map     // status line or "closed" -> *atomic.Int64
}

func (s *soakStats) count(key string) {
	v, _ := s.slowStatus.LoadOrStore(key, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// TestSoakSlowClients runs the real handler on a serving.Server on
// 127.0.0.1 with TLS, the flag defaults the server binary uses, under
// soakSlowClients connections that each declare a 3 MiB body and trickle
// it (half 1 byte per second as in the report, half 20 KiB/s),
// reconnecting when cut, while valid reviews arrive at soakValidPerSec.
// Every valid review must succeed within its timeout and the heap (of the
// whole test process, clients included) must stay under the Deployment's
// memory limit. Without the envelope the injector grew its buffer to each
// declared 3 MiB at once (600 MiB for 200 clients) and kept the
// connections for as long as they trickled.
func TestSoakSlowClients(t *testing.T) {
	if testing.Short() {
		t.Skip("a one-minute soak; runs without -short")
	}
	var o serving.Options
	fs := pflag.NewFlagSet("soak", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	h := newTestHandler(t, sampleConfig(t))
	h.Envelope = o.Envelope()
	srv := servingtest.Start(t, o, func(s *serving.Server) { s.Register("/inject", h) })

	review := reviewFor(t, []byte(nginxPod), "shop", false)
	stats := &soakStats{}
	stop := make(chan struct{})
	var wg sync.WaitGroup

	var peakHeap, peakSys uint64
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peakHeap, peakSys = max(peakHeap, ms.HeapInuse), max(peakSys, ms.Sys)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	for i := range soakSlowClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chunk, every := 1, time.Second
			if i%2 == 1 {
				chunk, every = 1<<10, 50*time.Millisecond
			}
			slowClient(srv, stats, stop, chunk, every)
		}()
	}

	client := srv.Client(soakReviewTimout)
	var valid sync.WaitGroup
	// Open loop: each tick sends what the rate owes by now, so a starved
	// test goroutine does not lower the offered load.
	tick := time.NewTicker(time.Second / soakValidPerSec)
	begin, sent := time.Now(), 0
	for time.Since(begin) < soakDuration {
		<-tick.C
		for due := int(time.Since(begin) * soakValidPerSec / time.Second); sent < due; sent++ {
			valid.Add(1)
			go func() {
				defer valid.Done()
				validReview(client, srv.URL("/inject"), review, stats)
			}()
		}
	}
	tick.Stop()
	valid.Wait()
	close(stop)
	wg.Wait()

	lat := slices.Clone(stats.latencies)
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(float64(len(lat))*p))]
	}
	var slow []string
	stats.slowStatus.Range(func(k, v any) bool {
		slow = append(slow, fmt.Sprintf("%q: %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(slow)
	t.Logf("valid reviews: %d ok, %d failed; latency p50 %v p99 %v max %v", len(lat), len(stats.failures), pct(0.50), pct(0.99), pct(1))
	t.Logf("slow connections: %d opened, %d dial errors, longest held until the server's answer %v; server answers: %s",
		stats.slowOpened.Load(), stats.slowDialErrors.Load(), time.Duration(stats.slowLongest.Load()).Round(time.Millisecond), strings.Join(slow, ", "))
	t.Logf("heap in use peak %.1f MiB, Go runtime Sys peak %.1f MiB, process peak RSS %s (clients included)", float64(peakHeap)/(1<<20), float64(peakSys)/(1<<20), peakRSS())

	if n := len(stats.failures); n > 0 {
		t.Errorf("%d of %d valid reviews failed, first: %s", n, n+len(lat), stats.failures[0])
	}
	if peakHeap >= soakMemoryLimit {
		t.Errorf("heap in use peaked at %d bytes, over the %d byte memory limit", peakHeap, soakMemoryLimit)
	}
	if _, ok := stats.slowStatus.Load("HTTP/1.1 408 Request Timeout"); !ok {
		t.Error("no trickled body was cut with 408")
	}
	if v, ok := stats.slowStatus.Load("HTTP/1.1 200 OK"); ok {
		t.Errorf("%d trickled bodies were answered 200", v.(*atomic.Int64).Load())
	}
}

// slowClient keeps one connection trickling a declared 3 MiB body, chunk
// bytes every period, and reconnects when the server answers or closes.
func slowClient(srv *servingtest.Server, stats *soakStats, stop <-chan struct{}, chunk int, every time.Duration) {
	payload := bytes.Repeat([]byte(" "), chunk)
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", srv.Addr, srv.ClientTLS)
		if err != nil {
			stats.slowDialErrors.Add(1)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		stats.slowOpened.Add(1)
		opened := time.Now()
		answered := make(chan string, 1)
		go func() {
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil && line == "" {
				line = "closed"
			}
			answered <- strings.TrimSpace(line)
		}()
		_, err = fmt.Fprintf(c, "POST /inject HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", MaxBodyBytes)
		tick := time.NewTicker(every)
		line := ""
	trickle:
		for err == nil {
			select {
			case <-stop:
				line = "open when the soak ended"
				break trickle
			case line = <-answered:
				break trickle
			case <-tick.C:
				_, err = c.Write(payload)
			}
		}
		tick.Stop()
		_ = c.Close()
		if line == "" {
			line = <-answered
		}
		if line != "open when the soak ended" {
			for d := int64(time.Since(opened)); ; {
				cur := stats.slowLongest.Load()
				if d <= cur || stats.slowLongest.CompareAndSwap(cur, d) {
					break
				}
			}
		}
		stats.count(line)
		if line == "open when the soak ended" {
			<-answered
		}
	}
}

func validReview(client *http.Client, url string, review []byte, stats *soakStats) {
	start := time.Now()
	fail := func(format string, args ...any) {
		stats.mu.Lock()
		stats.failures = append(stats.failures, fmt.Sprintf(format, args...))
		stats.mu.Unlock()
	}
	resp, err := client.Post(url, "application/json", bytes.NewReader(review))
	if err != nil {
		fail("%v", err)
		return
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	d := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK {
		fail("status %d after %v: %s %v", resp.StatusCode, d, body, err)
		return
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &out); err != nil || out.Response == nil || !out.Response.Allowed || len(out.Response.Patch) == 0 {
		fail("not an injecting answer after %v: %s", d, body)
		return
	}
	stats.mu.Lock()
	stats.latencies = append(stats.latencies, d)
	stats.mu.Unlock()
}

// peakRSS is the process's peak resident set (VmHWM), for the report.
func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
