// Package cadir watches a directory of CA files (the operator's --ca-dir)
// and reports when their combined content changes.
//
// In a pod the directory is a mounted Secret. The kubelet updates it by
// writing a new "..<timestamp>" directory and atomically renaming a new
// "..data" symlink over the old one; the visible files ("ca.crt") are
// symlinks through "..data" and never change themselves, so a watch on a
// file path misses the update. The watcher therefore watches the directory,
// re-reads the files through their visible names on any event, and compares
// a sha256 of the content. A poll (default 30 s) covers lost events, a
// directory that does not exist yet, and an fsnotify that failed.
//
// It must not import any other hookwright package, nor a Kubernetes client.
// controllers/cadir.go runs it and publishes the CAs it reads.
package cadir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
)

// Defaults for Options.
const (
	defaultDebounce     = 100 * time.Millisecond
	defaultPollInterval = 30 * time.Second
	defaultMaxFileSize  = 1 << 20 // bytes; a CA bundle is a few KiB
)

// defaultPatterns select the bundle files when Options.Files is empty:
// certificate files only, so keys or other Secret entries are never read.
var defaultPatterns = []string{"*.crt", "*.pem"}

// File is one bundle file as read.
type File struct {
	Name string // base name in the directory, e.g. "ca.crt"
	Data []byte
}

// Snapshot is the watched content at one point in time.
type Snapshot struct {
	// DirExists is false when the directory is missing (then Files is empty).
	DirExists bool
	// Files are the matching files in name order. A listed name whose
	// symlink dangles or that was removed is simply absent.
	Files []File
	// Bundle is the files' contents concatenated in name order, each ending
	// in a newline so PEM blocks of adjacent files never merge.
	Bundle []byte
	// Hash is the hex sha256 of Bundle; events fire when it changes.
	Hash string
}

// Options configure a Watcher.
type Options struct {
	// Dir is the directory to watch (required). It may not exist yet.
	Dir string
	// Files are exact base names to read (e.g. "ca.crt"). Empty means every
	// entry matching Patterns. Names starting with "." (the kubelet's
	// "..data" and "..<timestamp>" internals) are never read directly.
	Files []string
	// Patterns are filepath.Match patterns used when Files is empty;
	// default defaultPatterns.
	Patterns []string
	// Debounce waits this long after the last filesystem event before
	// re-reading (default 100 ms), so a multi-step kubelet update is read
	// once. A steady stream of events is still read at least every 10×Debounce.
	Debounce time.Duration
	// PollInterval re-reads regardless of events (default 30 s).
	PollInterval time.Duration
	// DisableFSNotify polls only (for filesystems without inotify, and tests).
	DisableFSNotify bool
	// MaxFileSize in bytes; a larger file fails the read (default 1 MiB).
	MaxFileSize int64
	// Logger receives read and watcher errors; default discards.
	Logger logr.Logger
	// OnChange is called with the first snapshot and then once per content
	// change, serially from Run's goroutine (required). It must not block
	// for long (events are not read meanwhile) and must not modify the
	// snapshot, which Current also returns. To turn it into caBundle bytes
	// that tolerate one broken file, merge the Files' Data with
	// pki.MergeBundlesPEM.
	OnChange func(Snapshot)
}

// Watcher watches one directory. Create it with New and start it with Run.
type Watcher struct {
	o   Options
	log logr.Logger

	mu      sync.Mutex
	current Snapshot
	started bool

	// newFSWatcher is swapped in tests to inject watcher failures.
	newFSWatcher func() (*fsnotify.Watcher, error)
}

// New validates o and applies defaults. It does not touch the filesystem.
func New(o Options) (*Watcher, error) {
	if o.Dir == "" {
		return nil, errors.New("cadir: Dir is required")
	}
	if o.OnChange == nil {
		return nil, errors.New("cadir: OnChange is required")
	}
	if len(o.Files) == 0 && len(o.Patterns) == 0 {
		o.Patterns = defaultPatterns
	}
	for _, p := range o.Patterns {
		if _, err := filepath.Match(p, ""); err != nil {
			return nil, fmt.Errorf("cadir: pattern %q: %w", p, err)
		}
	}
	for _, f := range o.Files {
		if f == "" || strings.ContainsRune(f, os.PathSeparator) || strings.HasPrefix(f, ".") {
			return nil, fmt.Errorf("cadir: file name %q must be a plain, non-hidden base name", f)
		}
	}
	if o.Debounce <= 0 {
		o.Debounce = defaultDebounce
	}
	if o.PollInterval <= 0 {
		o.PollInterval = defaultPollInterval
	}
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = defaultMaxFileSize
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	o.Dir = filepath.Clean(o.Dir)
	return &Watcher{o: o, log: o.Logger.WithValues("dir", o.Dir), newFSWatcher: fsnotify.NewWatcher}, nil
}

// latest returns the last snapshot passed to OnChange (zero before the first).
func (w *Watcher) latest() Snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// read reads the directory once, as Run does on every event or poll.
func (w *Watcher) Read() (Snapshot, error) {
	return read(w.o.Dir, w.o.Files, w.o.Patterns, w.o.MaxFileSize)
}

// read reads the bundle files of dir: the names in files, or, when files is
// empty, the non-hidden entries matching patterns (defaultPatterns if none)
// that resolve to regular files. A missing dir or file is not an error; any
// other read error is, because a partial bundle could drop a CA in use.
// maxSize <= 0 means defaultMaxFileSize.
func read(dir string, files, patterns []string, maxSize int64) (Snapshot, error) {
	if maxSize <= 0 {
		maxSize = defaultMaxFileSize
	}
	names := slices.Clone(files)
	if len(names) == 0 {
		if len(patterns) == 0 {
			patterns = defaultPatterns
		}
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return snapshot(false, nil), nil
		}
		if err != nil {
			return Snapshot{}, err
		}
		for _, e := range entries {
			if n := e.Name(); !strings.HasPrefix(n, ".") && matchAny(patterns, n) {
				names = append(names, n)
			}
		}
	} else if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return snapshot(false, nil), nil
	} else if err != nil {
		return Snapshot{}, err
	}
	slices.Sort(names)
	names = slices.Compact(names)

	var out []File
	for _, n := range names {
		data, err := readFile(filepath.Join(dir, n), maxSize)
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, errIsDir):
			continue // removed, dangling mid-swap, or a directory: not a bundle file
		case err != nil:
			return Snapshot{}, err
		}
		out = append(out, File{Name: n, Data: data})
	}
	return snapshot(true, out), nil
}

var errIsDir = errors.New("is a directory")

func readFile(path string, maxSize int64) ([]byte, error) {
	f, err := os.Open(path) // follows the ..data symlinks
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, errIsDir
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxSize)
	}
	return data, nil
}

func snapshot(exists bool, files []File) Snapshot {
	var bundle []byte
	for _, f := range files {
		bundle = append(bundle, f.Data...)
		if len(f.Data) > 0 && f.Data[len(f.Data)-1] != '\n' {
			bundle = append(bundle, '\n')
		}
	}
	sum := sha256.Sum256(bundle)
	return Snapshot{DirExists: exists, Files: files, Bundle: bundle, Hash: hex.EncodeToString(sum[:])}
}

func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := filepath.Match(p, name); ok {
			return true
		}
	}
	return false
}

// Run reads the directory, calls OnChange with the first snapshot, then
// watches until ctx is done and returns nil. Errors (unreadable files, a
// failing or lost watcher) are logged and retried; Run never gives up
// early. Run may be called once per Watcher.
func (w *Watcher) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("cadir: Run called twice")
	}
	w.started = true
	w.mu.Unlock()

	r := &runner{w: w, log: w.log, parent: filepath.Dir(w.o.Dir)}
	defer r.closeWatcher()

	poll := time.NewTicker(w.o.PollInterval)
	defer poll.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var pendingSince time.Time // zero: no read pending

	r.ensureWatch()
	r.scan(true)
	for {
		var events <-chan fsnotify.Event
		var errs <-chan error
		if r.fw != nil {
			events, errs = r.fw.Events, r.fw.Errors
		}
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				r.dropWatcher("event channel closed")
				continue
			}
			if !r.relevant(ev) {
				continue
			}
			if (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) && ev.Name == w.o.Dir {
				// The directory itself went away or was moved: its watch now
				// follows a stale inode, so drop it and re-add by path.
				_ = r.fw.Remove(w.o.Dir)
				r.watchingDir = false
			}
			now := time.Now()
			if pendingSince.IsZero() {
				pendingSince = now
			}
			if now.Sub(pendingSince) < 10*w.o.Debounce {
				debounce.Reset(w.o.Debounce)
			}
		case err, ok := <-errs:
			if !ok {
				r.dropWatcher("error channel closed")
				continue
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost but the watch is fine: just re-read.
				r.log.Info("fsnotify queue overflowed; re-reading")
				if pendingSince.IsZero() {
					pendingSince = time.Now()
				}
				debounce.Reset(w.o.Debounce)
				continue
			}
			r.log.Error(err, "fsnotify watcher failed; polling until it is re-established", "pollInterval", w.o.PollInterval)
			r.dropWatcher("")
		case <-debounce.C:
			pendingSince = time.Time{}
			r.ensureWatch()
			r.scan(false)
		case <-poll.C:
			r.ensureWatch()
			// A change seen by polling is read again after Debounce, like an
			// event, so a file caught mid-write (truncated) is not delivered.
			if r.changed() && pendingSince.IsZero() {
				pendingSince = time.Now()
				debounce.Reset(w.o.Debounce)
			}
		}
	}
}

// runner is the state owned by Run's goroutine.
type runner struct {
	w      *Watcher
	log    logr.Logger
	parent string

	fw             *fsnotify.Watcher
	watchingDir    bool
	watchingParent bool
	lastHash       string
	delivered      bool
	lastErr        string
}

// relevant filters events: anything inside Dir (including "..data" swaps),
// and only Dir itself among its parent's children.
func (r *runner) relevant(ev fsnotify.Event) bool {
	name := filepath.Clean(ev.Name)
	return name == r.w.o.Dir || filepath.Dir(name) == r.w.o.Dir
}

// ensureWatch (re)creates the fsnotify watcher and watches Dir, or Dir's
// parent while Dir is missing so its creation is seen without waiting for
// a poll. Failures are logged once per distinct error and retried at the
// next poll.
func (r *runner) ensureWatch() {
	if r.w.o.DisableFSNotify {
		return
	}
	if r.fw == nil {
		fw, err := r.w.newFSWatcher()
		if err != nil {
			r.logOnce(err, "cannot create fsnotify watcher; polling only")
			return
		}
		r.fw, r.watchingDir, r.watchingParent = fw, false, false
	}
	if !r.watchingDir {
		if err := r.fw.Add(r.w.o.Dir); err == nil {
			r.watchingDir = true
			r.lastErr = ""
		} else if !errors.Is(err, fs.ErrNotExist) {
			r.logOnce(err, "cannot watch directory; polling")
		}
	}
	switch {
	case r.watchingDir && r.watchingParent:
		_ = r.fw.Remove(r.parent)
		r.watchingParent = false
	case !r.watchingDir && !r.watchingParent:
		if err := r.fw.Add(r.parent); err == nil {
			r.watchingParent = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			r.logOnce(err, "cannot watch parent directory; polling")
		}
	}
}

func (r *runner) dropWatcher(why string) {
	if why != "" {
		r.log.Info("fsnotify watcher lost; polling until it is re-established", "reason", why)
	}
	r.closeWatcher()
}

func (r *runner) closeWatcher() {
	if r.fw != nil {
		_ = r.fw.Close()
		r.fw = nil
	}
	r.watchingDir, r.watchingParent = false, false
}

func (r *runner) logOnce(err error, msg string) {
	if s := msg + ": " + err.Error(); s != r.lastErr {
		r.lastErr = s
		r.log.Error(err, msg)
	}
}

// changed reports whether a read now would deliver something.
func (r *runner) changed() bool {
	snap, err := r.w.Read()
	if err != nil {
		r.logOnce(err, "reading CA files failed; keeping the previous bundle")
		return false
	}
	return !r.delivered || snap.Hash != r.lastHash
}

// scan reads the files and delivers a snapshot if its hash changed (or
// always on the first successful read). A failed read keeps the previous
// state: publishing a partial bundle could drop a CA still in use.
func (r *runner) scan(first bool) {
	snap, err := r.w.Read()
	if err != nil {
		r.logOnce(err, "reading CA files failed; keeping the previous bundle")
		return
	}
	if r.delivered && snap.Hash == r.lastHash {
		return
	}
	r.lastHash, r.delivered = snap.Hash, true
	r.w.mu.Lock()
	r.w.current = snap
	r.w.mu.Unlock()
	r.log.V(1).Info("CA bundle changed", "hash", snap.Hash, "files", len(snap.Files), "dirExists", snap.DirExists, "initial", first)
	r.w.o.OnChange(snap)
}
