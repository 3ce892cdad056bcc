package cluster

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Watch sees every event in order, across a watch the server closes
// (reopened from the last resourceVersion seen), and ends at the count.
func TestWatchCountsEveryEventAcrossReopens(t *testing.T) {
	var opened []string
	rv := 10
	w := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		opened = append(opened, o.ResourceVersion)
		fw := watch.NewFakeWithChanSize(3, false)
		for i := 0; i < 3; i++ {
			rv++
			fw.Modify(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: strconv.Itoa(rv)}})
		}
		fw.Stop() // the server ends each watch after three events
		return fw, nil
	}
	seen := 0
	var last string
	err := Watch(context.Background(), 30*time.Second, "seven renewals", "10", w, func(ev watch.Event) (bool, error) {
		seen++
		l := ev.Object.(*coordinationv1.Lease)
		if last != "" && l.ResourceVersion <= last {
			t.Errorf("event %s after %s", l.ResourceVersion, last)
		}
		last = l.ResourceVersion
		return seen == 7, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(opened) < 3 || opened[0] != "10" || opened[1] != "13" || opened[2] != "16" {
		t.Errorf("watches opened from %v, want 10, 13, 16", opened)
	}
}

func TestWatchTimesOutNamingWhat(t *testing.T) {
	w := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return watch.NewFake(), nil
	}
	err := Watch(context.Background(), 200*time.Millisecond, "two renewals", "1", w, func(watch.Event) (bool, error) {
		return false, nil
	})
	if err == nil || !strings.Contains(err.Error(), "timed out after 200ms watching for two renewals") {
		t.Fatalf("err = %v", err)
	}
}

func TestWatchFailsOnAnErrorEvent(t *testing.T) {
	w := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		fw := watch.NewFakeWithChanSize(1, false)
		fw.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonGone, Message: "too old resource version"})
		return fw, nil
	}
	err := Watch(context.Background(), 30*time.Second, "two renewals", "1", w, func(watch.Event) (bool, error) {
		t.Error("each called")
		return false, nil
	})
	if err == nil || !strings.Contains(err.Error(), "too old resource version") {
		t.Fatalf("err = %v", err)
	}
}

// A short interval stretches to a twentieth of the time waited, up to
// MaxPollGap; a long one is left alone.
func TestPollGap(t *testing.T) {
	for _, c := range []struct{ interval, waited, want time.Duration }{
		{5 * time.Millisecond, 0, 5 * time.Millisecond},
		{5 * time.Millisecond, 50 * time.Millisecond, 5 * time.Millisecond},
		{5 * time.Millisecond, time.Second, 50 * time.Millisecond},
		{5 * time.Millisecond, 2 * time.Second, MaxPollGap},
		{5 * time.Millisecond, 3 * time.Minute, MaxPollGap},
		{100 * time.Millisecond, time.Minute, 100 * time.Millisecond},
		{time.Second, time.Minute, time.Second},
	} {
		if got := pollGap(c.interval, c.waited); got != c.want {
			t.Errorf("pollGap(%s, %s) = %s, want %s", c.interval, c.waited, got, c.want)
		}
	}
}
