package controllers

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/hookwright/hookwright/internal/certificates/cadir"
	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// caDir is the --ca-dir bundle: the CA files of a directory (*.crt, *.pem),
// watched with internal/certificates/cadir. Its CAs are published in every SelfSigned
// configuration's caBundle next to the operator's own (the union, tidied);
// a change re-reconciles every CR of both kinds.
type caDir struct {
	w   *cadir.Watcher
	log logr.Logger

	mu     sync.Mutex
	bundle []byte
	subs   []chan event.GenericEvent
}

func newCADir(dir string, log logr.Logger) (*caDir, error) {
	d := &caDir{log: log.WithName("ca-dir").WithValues("dir", dir)}
	w, err := cadir.New(cadir.Options{Dir: dir, Logger: d.log, OnChange: d.onChange})
	if err != nil {
		return nil, err
	}
	d.w = w
	// Read once now so the first reconciles already publish the directory's CAs.
	if snap, err := w.Read(); err == nil {
		d.set(snap)
	} else {
		d.log.Error(err, "read CA directory; the watcher retries")
	}
	return d, nil
}

// Bundle returns the directory's CAs (PEM, newest first; nil when none).
func (d *caDir) Bundle() []byte {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bundle
}

// subscribe returns a channel that receives an event after each change.
func (d *caDir) subscribe() <-chan event.GenericEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := make(chan event.GenericEvent, 1)
	d.subs = append(d.subs, ch)
	return ch
}

func (d *caDir) set(s cadir.Snapshot) bool {
	var files [][]byte
	for _, f := range s.Files {
		files = append(files, f.Data)
	}
	b, errs := pki.MergeBundlesPEM(files, pki.BundleOptions{Max: -1, CAOnly: true})
	for i, err := range errs {
		d.log.Error(err, "CA file skipped", "file", s.Files[i].Name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := !bytes.Equal(b, d.bundle)
	d.bundle = b
	return changed
}

func (d *caDir) onChange(s cadir.Snapshot) {
	if !d.set(s) {
		return
	}
	n, _ := pki.ParseCertsPEM(d.Bundle())
	d.log.Info("CA directory changed; republishing caBundles", "cas", len(n), "hash", s.Hash)
	d.mu.Lock()
	defer d.mu.Unlock()
	ev := event.GenericEvent{Object: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ca-dir"}}}
	for _, ch := range d.subs {
		select {
		case ch <- ev:
		default: // one pending event already re-reconciles everything
		}
	}
}

// Start runs the watcher until ctx ends (a manager Runnable).
func (d *caDir) Start(ctx context.Context) error {
	if err := d.w.Run(ctx); err != nil {
		return fmt.Errorf("ca-dir: %w", err)
	}
	return nil
}

// NeedLeaderElection is false: a standby keeps the bundle current, and
// events wait in the channel until its controllers start.
func (d *caDir) NeedLeaderElection() bool { return false }
