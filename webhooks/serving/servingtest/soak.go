package servingtest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
)

// SlowClients keeps n connections to a webhook server, each declaring a
// 3 MiB body and trickling it (even ones 1 byte per second, as in issue 11's
// report, odd ones 1 KiB every 50 ms), reconnecting whenever the server
// answers or closes. Stop ends them and reports.
type SlowClients struct {
	stop chan struct{}
	wg   sync.WaitGroup

	opened, dialErrors, longest atomic.Int64
	mu                          sync.Mutex
	answers                     map[string]int
}

// SlowReport is what the slow clients saw.
type SlowReport struct {
	Opened, DialErrors int64
	// Longest is the longest a connection was held before the server's
	// answer.
	Longest time.Duration
	// Answers counts the servers' status lines, "closed" for a close
	// without one, and "open when stopped".
	Answers map[string]int
}

func (r SlowReport) String() string {
	var a []string
	for k, v := range r.Answers {
		a = append(a, fmt.Sprintf("%q: %d", k, v))
	}
	slices.Sort(a)
	return fmt.Sprintf("%d opened, %d dial errors, longest held until the server's answer %v; answers: %s",
		r.Opened, r.DialErrors, r.Longest.Round(time.Millisecond), strings.Join(a, ", "))
}

const openWhenStopped = "open when stopped"

// StartSlowClients starts n slow clients POSTing to path on addr.
//
// The clients resume TLS sessions, as a determined attacker would: a full
// handshake per reconnect costs both ends of a test on one machine more CPU
// than the server's part of the soak.
func StartSlowClients(addr string, cfg *tls.Config, path string, n int) *SlowClients {
	cfg = cfg.Clone()
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(n)
	s := &SlowClients{stop: make(chan struct{}), answers: map[string]int{}}
	for i := range n {
		chunk, every := 1, time.Second
		if i%2 == 1 {
			chunk, every = 1<<10, 50*time.Millisecond
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.run(addr, cfg, path, chunk, every)
		}()
	}
	return s
}

// Stop ends the clients and returns their report.
func (s *SlowClients) Stop() SlowReport {
	close(s.stop)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return SlowReport{Opened: s.opened.Load(), DialErrors: s.dialErrors.Load(), Longest: time.Duration(s.longest.Load()), Answers: maps.Clone(s.answers)}
}

func (s *SlowClients) run(addr string, cfg *tls.Config, path string, chunk int, every time.Duration) {
	payload := bytes.Repeat([]byte(" "), chunk)
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			s.dialErrors.Add(1)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		s.opened.Add(1)
		opened := time.Now()
		answered := make(chan string, 1)
		go func() {
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil && line == "" {
				line = "closed"
			}
			answered <- strings.TrimSpace(line)
		}()
		_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", path, 3<<20)
		tick := time.NewTicker(every)
		line := ""
	trickle:
		for err == nil {
			select {
			case <-s.stop:
				line = openWhenStopped
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
		if line != openWhenStopped {
			for d := int64(time.Since(opened)); ; {
				cur := s.longest.Load()
				if d <= cur || s.longest.CompareAndSwap(cur, d) {
					break
				}
			}
		}
		s.mu.Lock()
		s.answers[line]++
		s.mu.Unlock()
	}
}

// LoadReport is the outcome of RunLoad.
type LoadReport struct {
	OK       int
	Failures []string
	P50, P99 time.Duration
	Max      time.Duration
}

func (r LoadReport) String() string {
	return fmt.Sprintf("%d ok, %d failed; latency p50 %v p99 %v max %v", r.OK, len(r.Failures),
		r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Max.Round(time.Microsecond))
}

// SoakDuration is how long the slow-client soaks offer their load: 20 s
// in make test, in which every trickled body is cut several times over
// (each within about 4 s: serving's BodyGrace and minimum rate), and issue
// 11's full minute with HOOKWRIGHT_SCALE=full (make soak).
func SoakDuration() time.Duration {
	if os.Getenv("HOOKWRIGHT_SCALE") == "full" {
		return time.Minute
	}
	return 20 * time.Second
}

// RunLoad calls do perSec times a second for d, open loop (each tick sends
// what the rate owes by then, so a starved caller does not lower the
// offered load), and waits for the calls to end. do returns an error for a
// failed call.
func RunLoad(perSec int, d time.Duration, do func() error) LoadReport {
	var (
		mu  sync.Mutex
		lat []time.Duration
		rep LoadReport
		wg  sync.WaitGroup
	)
	tick := time.NewTicker(time.Second / time.Duration(perSec))
	defer tick.Stop()
	begin, sent := time.Now(), 0
	for time.Since(begin) < d {
		<-tick.C
		for due := int(time.Since(begin) * time.Duration(perSec) / time.Second); sent < due; sent++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				err := do()
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					rep.Failures = append(rep.Failures, fmt.Sprintf("after %v: %v", took, err))
					return
				}
				lat = append(lat, took)
			}()
		}
	}
	wg.Wait()
	slices.Sort(lat)
	rep.OK = len(lat)
	if len(lat) > 0 {
		rep.P50, rep.P99, rep.Max = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	}
	return rep
}

// PeakSampler calls sample every period until Stop and keeps the largest
// value it returned.
type PeakSampler struct {
	stop chan struct{}
	done chan struct{}
	peak atomic.Uint64
}

// StartPeakSampler starts sampling.
func StartPeakSampler(period time.Duration, sample func() uint64) *PeakSampler {
	p := &PeakSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			if v := sample(); v > p.peak.Load() {
				p.peak.Store(v)
			}
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// Stop ends sampling and returns the peak.
func (p *PeakSampler) Stop() uint64 {
	close(p.stop)
	<-p.done
	return p.peak.Load()
}

// PostInjectingReview posts an AdmissionReview to url and returns an error
// unless the answer is 200 with an allowed response carrying a patch (an
// injection): the valid-review half of a soak.
func PostInjectingReview(client *http.Client, url string, review []byte) error {
	resp, err := client.Post(url, "application/json", bytes.NewReader(review))
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s %v", resp.StatusCode, body, err)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &out); err != nil || out.Response == nil || !out.Response.Allowed || len(out.Response.Patch) == 0 {
		return fmt.Errorf("not an injecting answer: %s", body)
	}
	return nil
}
