package cluster

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// webhookDurationMetric is the API server's histogram of each call to an
// admission webhook, from the request's send to the answer's decode
// (k8s.io/apiserver pkg/admission/metrics, "webhook_admission_duration_seconds"
// in the "apiserver_admission" namespace).
const webhookDurationMetric = "apiserver_admission_webhook_admission_duration_seconds"

// WebhookLatency is the API server's histogram of calls to one webhook,
// summed over its operation, type and rejected labels.
type WebhookLatency struct {
	// Count is the number of calls; Sum their total time in seconds.
	Count uint64
	Sum   float64
	// Buckets are cumulative counts per upper bound (seconds), ascending,
	// without +Inf (Count is its count).
	Buckets []LatencyBucket
}

// LatencyBucket is one bucket of a WebhookLatency.
type LatencyBucket struct {
	UpperBound float64
	Cumulative uint64
}

// WebhookLatency reads the API server's /metrics and returns the histogram
// of calls to the webhook named name (the configuration's webhooks[].name).
// A webhook never called yet has a zero WebhookLatency.
func (c *Cluster) WebhookLatency(ctx context.Context, name string) (WebhookLatency, error) {
	body, err := c.Clientset.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return WebhookLatency{}, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return WebhookLatency{}, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	var l WebhookLatency
	f := fams[webhookDurationMetric]
	if f == nil {
		return l, nil
	}
	bounds := map[float64]uint64{}
	for _, m := range f.Metric {
		if m.Histogram == nil || label(m.Label, "name") != name {
			continue
		}
		l.Count += m.Histogram.GetSampleCount()
		l.Sum += m.Histogram.GetSampleSum()
		for _, b := range m.Histogram.Bucket {
			if !math.IsInf(b.GetUpperBound(), 1) {
				bounds[b.GetUpperBound()] += b.GetCumulativeCount()
			}
		}
	}
	for ub, n := range bounds {
		l.Buckets = append(l.Buckets, LatencyBucket{UpperBound: ub, Cumulative: n})
	}
	sort.Slice(l.Buckets, func(i, j int) bool { return l.Buckets[i].UpperBound < l.Buckets[j].UpperBound })
	return l, nil
}

func label[T interface {
	GetName() string
	GetValue() string
}](labels []T, name string) string {
	for _, l := range labels {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Minus returns the calls made between an earlier reading b and l.
func (l WebhookLatency) Minus(b WebhookLatency) WebhookLatency {
	before := map[float64]uint64{}
	for _, x := range b.Buckets {
		before[x.UpperBound] = x.Cumulative
	}
	d := WebhookLatency{Count: l.Count - b.Count, Sum: l.Sum - b.Sum}
	for _, x := range l.Buckets {
		d.Buckets = append(d.Buckets, LatencyBucket{UpperBound: x.UpperBound, Cumulative: x.Cumulative - before[x.UpperBound]})
	}
	return d
}

// Slowest returns the upper bound of the lowest bucket holding every call
// (the slowest call took at most that long), or +Inf when some call was
// slower than the largest bound; 0 when there was no call.
func (l WebhookLatency) Slowest() float64 {
	if l.Count == 0 {
		return 0
	}
	for _, b := range l.Buckets {
		if b.Cumulative == l.Count {
			return b.UpperBound
		}
	}
	return math.Inf(1)
}

// String is a figure for a log: "N calls, mean M; ≤0.005s a, ≤0.025s b,
// …, >10s z" (each count is the calls in that bucket alone; empty buckets
// above the slowest are left out).
func (l WebhookLatency) String() string {
	if l.Count == 0 {
		return "0 calls"
	}
	mean := time.Duration(l.Sum / float64(l.Count) * float64(time.Second))
	parts := []string{}
	var prev uint64
	for _, b := range l.Buckets {
		if n := b.Cumulative - prev; n > 0 {
			parts = append(parts, fmt.Sprintf("≤%gs %d", b.UpperBound, n))
		}
		prev = b.Cumulative
		if prev == l.Count {
			break
		}
	}
	if prev < l.Count && len(l.Buckets) > 0 {
		parts = append(parts, fmt.Sprintf(">%gs %d", l.Buckets[len(l.Buckets)-1].UpperBound, l.Count-prev))
	}
	return fmt.Sprintf("%d calls, mean %s; %s", l.Count, mean.Round(100*time.Microsecond), strings.Join(parts, ", "))
}
