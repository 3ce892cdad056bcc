package cadir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr/testr"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	// deliverWithin bounds a delivery: ten times the operator's promise
	// (2 s), so a loaded machine meets it, and still far under the 1 h
	// poll of the fsnotify-only cases, which only an event can beat.
	deliverWithin = 20 * time.Second
	quietFor      = 600 * time.Millisecond // > debounce + scheduling slack: no further events
	// runWithin bounds how long Run takes to read an injected error or to
	// return once cancelled (at once on an idle machine).
	runWithin = 20 * time.Second
)

// atomicWriter reproduces the kubelet's AtomicWriter layout and update
// sequence for a Secret volume:
//
//	dir/..2026_11_29_20_40_00.123456789/ca.crt   real files
//	dir/..data -> ..2026_11_29_20_40_00.123456789
//	dir/ca.crt -> ..data/ca.crt                   user-visible symlinks
//
// An update writes a new timestamped directory, points "..data_tmp" at it,
// renames "..data_tmp" over "..data" (the atomic swap), adds or removes the
// user-visible symlinks, and deletes the old timestamped directory.
type atomicWriter struct {
	t   *testing.T
	dir string
	n   int
}

func (a *atomicWriter) write(files map[string]string) {
	a.t.Helper()
	if err := os.MkdirAll(a.dir, 0o755); err != nil {
		a.t.Fatal(err)
	}
	a.n++
	ts := fmt.Sprintf("..%s.%09d", time.Date(2026, 11, 29, 20, 40, 0, 0, time.UTC).Format("2006_01_02_15_04_05"), a.n)
	if err := os.Mkdir(filepath.Join(a.dir, ts), 0o755); err != nil {
		a.t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(a.dir, ts, name), []byte(content), 0o644); err != nil {
			a.t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(a.dir, "..data"))
	tmp := filepath.Join(a.dir, "..data_tmp")
	must(a.t, os.Symlink(ts, tmp))
	must(a.t, os.Rename(tmp, filepath.Join(a.dir, "..data")))
	for name := range files {
		link := filepath.Join(a.dir, name)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			must(a.t, os.Symlink(filepath.Join("..data", name), link))
		}
	}
	entries, err := os.ReadDir(a.dir)
	must(a.t, err)
	for _, e := range entries {
		if n := e.Name(); !strings.HasPrefix(n, ".") {
			if _, keep := files[n]; !keep {
				must(a.t, os.Remove(filepath.Join(a.dir, n)))
			}
		}
	}
	if old != "" {
		must(a.t, os.RemoveAll(filepath.Join(a.dir, old)))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// harness runs a Watcher and collects its snapshots.
type harness struct {
	t      *testing.T
	w      *Watcher
	events chan Snapshot
	cancel context.CancelFunc
	done   chan error
}

// start runs a Watcher for o; prepare, if given, adjusts it before Run.
func start(t *testing.T, o Options, prepare ...func(*Watcher)) *harness {
	t.Helper()
	h := &harness{t: t, events: make(chan Snapshot, 100), done: make(chan error, 1)}
	o.OnChange = func(s Snapshot) { h.events <- s }
	if o.Logger.GetSink() == nil {
		o.Logger = testr.New(t)
	}
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	h.w = w
	for _, p := range prepare {
		p(w)
	}
	return h.run()
}

func (h *harness) run() *harness {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.w.Run(ctx) }()
	h.t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
		h.done <- nil // idempotent for Cleanup
	case <-time.After(runWithin):
		h.t.Fatal("Run did not return after cancel")
	}
}

func (h *harness) next(within time.Duration) Snapshot {
	h.t.Helper()
	select {
	case s := <-h.events:
		return s
	case <-time.After(within):
		h.t.Fatalf("no event within %s", within)
		return Snapshot{}
	}
}

func (h *harness) quiet(d time.Duration) {
	h.t.Helper()
	select {
	case s := <-h.events:
		h.t.Fatalf("unexpected event: %q", s.Bundle)
	case <-time.After(d):
	}
}

func pemish(s string) string {
	return "-----BEGIN CERTIFICATE-----\n" + s + "\n-----END CERTIFICATE-----\n"
}

func TestKubeletSymlinkSwap(t *testing.T) {
	t.Parallel()
	// Slow poll: only fsnotify can meet the deadline. Fast poll: events and
	// polls race, and each change must still be delivered exactly once.
	for name, poll := range map[string]time.Duration{"fsnotify": time.Hour, "fsnotify+poll": 30 * time.Millisecond} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testKubeletSymlinkSwap(t, poll)
		})
	}
}

func testKubeletSymlinkSwap(t *testing.T, poll time.Duration) {
	dir := filepath.Join(t.TempDir(), "ca")
	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A")})
	h := start(t, Options{Dir: dir, PollInterval: poll})

	first := h.next(deliverWithin)
	if !first.DirExists || string(first.Bundle) != pemish("A") || len(first.Files) != 1 || first.Files[0].Name != "ca.crt" {
		t.Fatalf("initial snapshot %+v", first)
	}
	if h.w.latest().Hash != first.Hash {
		t.Error("Current() differs from the delivered snapshot")
	}

	for i, content := range []string{pemish("B"), pemish("B") + pemish("A"), pemish("C")} {
		start := time.Now()
		aw.write(map[string]string{"ca.crt": content})
		got := h.next(deliverWithin)
		if string(got.Bundle) != content {
			t.Fatalf("change %d: bundle %q, want %q", i, got.Bundle, content)
		}
		t.Logf("change %d delivered after %s", i, time.Since(start).Round(time.Millisecond))
		h.quiet(quietFor) // exactly once
	}

	// Same content through a fresh timestamped directory: no event.
	aw.write(map[string]string{"ca.crt": pemish("C")})
	aw.write(map[string]string{"ca.crt": pemish("C")})
	h.quiet(quietFor)
}

func TestFilesAddedAndRemoved(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A"), "tls.key": "secret key"})
	h := start(t, Options{Dir: dir, PollInterval: time.Hour})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("A") {
		t.Fatalf("initial %q (keys must not be read)", got.Bundle)
	}

	// A second certificate file joins; files are concatenated in name order.
	aw.write(map[string]string{"ca.crt": pemish("A"), "extra.pem": "no trailing newline", "tls.key": "k"})
	got := h.next(deliverWithin)
	if want := pemish("A") + "no trailing newline\n"; string(got.Bundle) != want {
		t.Fatalf("bundle %q, want %q", got.Bundle, want)
	}
	if names := []string{got.Files[0].Name, got.Files[1].Name}; !slices.Equal(names, []string{"ca.crt", "extra.pem"}) {
		t.Errorf("files %v", names)
	}

	// Key removed from the Secret: its symlink goes away.
	aw.write(map[string]string{"extra.pem": "no trailing newline"})
	got = h.next(deliverWithin)
	if len(got.Files) != 1 || got.Files[0].Name != "extra.pem" {
		t.Fatalf("after removal %+v", got.Files)
	}

	// Non-matching and hidden files are ignored.
	must(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, ".hidden.crt"), []byte("x"), 0o644))
	must(t, os.Mkdir(filepath.Join(dir, "sub.crt"), 0o755))
	h.quiet(quietFor)

	// Everything removed: an empty bundle is a change too.
	aw.write(map[string]string{})
	if got := h.next(deliverWithin); len(got.Bundle) != 0 || !got.DirExists {
		t.Fatalf("empty: %+v", got)
	}
}

func TestExplicitFiles(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A"), "other.crt": pemish("X")})
	h := start(t, Options{Dir: dir, Files: []string{"ca.crt"}, PollInterval: time.Hour})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("A") {
		t.Fatalf("initial %q", got.Bundle)
	}
	aw.write(map[string]string{"ca.crt": pemish("A"), "other.crt": pemish("Y")})
	h.quiet(quietFor)
	aw.write(map[string]string{"other.crt": pemish("Y")})
	if got := h.next(deliverWithin); len(got.Files) != 0 {
		t.Fatalf("ca.crt removed: %+v", got.Files)
	}
}

func TestDirectoryCreatedLaterAndRemoved(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	h := start(t, Options{Dir: dir, PollInterval: time.Hour})
	if got := h.next(deliverWithin); got.DirExists || len(got.Bundle) != 0 {
		t.Fatalf("missing dir: %+v", got)
	}

	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("A") {
		t.Fatalf("after creation %q", got.Bundle)
	}
	h.quiet(quietFor)

	must(t, os.RemoveAll(dir))
	if got := h.next(deliverWithin); got.DirExists || len(got.Bundle) != 0 {
		t.Fatalf("after removal %+v", got)
	}

	aw.write(map[string]string{"ca.crt": pemish("B")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("B") {
		t.Fatalf("after re-creation %q", got.Bundle)
	}
	// The re-established watch sees swaps again.
	aw.write(map[string]string{"ca.crt": pemish("C")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("C") {
		t.Fatalf("after swap %q", got.Bundle)
	}
}

func TestPollFallbackWithoutFSNotify(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A")})
	h := start(t, Options{Dir: dir, DisableFSNotify: true, PollInterval: 50 * time.Millisecond}, func(w *Watcher) {
		w.newFSWatcher = func() (*fsnotify.Watcher, error) {
			t.Error("fsnotify used although disabled")
			return nil, errors.New("disabled")
		}
	})
	h.next(deliverWithin)
	aw.write(map[string]string{"ca.crt": pemish("B")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("B") {
		t.Fatalf("%q", got.Bundle)
	}
	aw.write(map[string]string{"ca.crt": pemish("B")})
	h.quiet(quietFor) // many polls, no change
}

// fsnotify cannot be created (e.g. inotify instance limit): poll instead.
func TestWatcherCreationFailsFallsBackToPolling(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A")})
	var attempts atomic.Int32
	h := start(t, Options{Dir: dir, PollInterval: 50 * time.Millisecond}, func(w *Watcher) {
		w.newFSWatcher = func() (*fsnotify.Watcher, error) {
			attempts.Add(1)
			return nil, errors.New("too many open files")
		}
	})
	h.next(deliverWithin)
	aw.write(map[string]string{"ca.crt": pemish("B")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("B") {
		t.Fatalf("%q", got.Bundle)
	}
	if attempts.Load() < 2 {
		t.Errorf("watcher creation retried %d times, want retries on poll", attempts.Load())
	}
}

// A watcher error drops the watcher; polling carries on and the watcher is
// re-established at the next poll.
func TestWatcherErrorFallsBackAndRecovers(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A")})
	var mu sync.Mutex
	var created []*fsnotify.Watcher
	h := start(t, Options{Dir: dir, PollInterval: 200 * time.Millisecond}, func(w *Watcher) {
		w.newFSWatcher = func() (*fsnotify.Watcher, error) {
			fw, err := fsnotify.NewWatcher()
			mu.Lock()
			created = append(created, fw)
			mu.Unlock()
			return fw, err
		}
	})
	h.next(deliverWithin)

	mu.Lock()
	first := created[0]
	mu.Unlock()
	// Inject an error the way fsnotify reports one. The send must not block
	// forever if Run has already closed the watcher.
	select {
	case first.Errors <- errors.New("injected watcher failure"):
	case <-time.After(runWithin):
		t.Fatal("Run did not read the error channel")
	}
	aw.write(map[string]string{"ca.crt": pemish("B")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("B") {
		t.Fatalf("%q", got.Bundle)
	}
	deadline := time.Now().Add(deliverWithin)
	for {
		mu.Lock()
		n := len(created)
		mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("watcher not re-established")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The new watcher delivers quickly again (poll alone would take 200 ms,
	// still fine; what matters is a single delivery per change).
	aw.write(map[string]string{"ca.crt": pemish("C")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("C") {
		t.Fatalf("%q", got.Bundle)
	}
	h.quiet(quietFor)

	// An overflow keeps the watcher and just re-reads.
	mu.Lock()
	last := created[len(created)-1]
	mu.Unlock()
	select {
	case last.Errors <- fsnotify.ErrEventOverflow:
	case <-time.After(runWithin):
		t.Fatal("Run did not read the error channel")
	}
	h.quiet(quietFor)
	mu.Lock()
	n := len(created)
	mu.Unlock()
	aw.write(map[string]string{"ca.crt": pemish("D")})
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("D") {
		t.Fatalf("%q", got.Bundle)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(created) != n {
		t.Errorf("overflow recreated the watcher")
	}
}

// A burst of events is read once, after it settles. Under heavy CPU load a
// gap in the burst may exceed the debounce, so allow one split but never a
// duplicate or a stale final state.
func TestDebounceBurst(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	aw := &atomicWriter{t: t, dir: dir}
	aw.write(map[string]string{"ca.crt": pemish("A")})
	h := start(t, Options{Dir: dir, PollInterval: time.Hour, Debounce: 300 * time.Millisecond})
	h.next(deliverWithin)
	// Rapid rewrites well within the debounce window.
	for i := range 5 {
		aw.write(map[string]string{"ca.crt": pemish(fmt.Sprint("burst", i))})
		time.Sleep(10 * time.Millisecond)
	}
	var got []string
	for len(got) == 0 || got[len(got)-1] != pemish("burst4") {
		got = append(got, string(h.next(deliverWithin).Bundle))
		if len(got) > 2 {
			t.Fatalf("burst of 5 writes delivered as %d+ events: %q", len(got), got)
		}
	}
	if len(got) == 2 && got[0] == got[1] {
		t.Fatalf("duplicate delivery %q", got)
	}
	h.quiet(quietFor)
}

// A read error (here: over MaxFileSize, which also works as root, unlike
// permission bits) keeps the previous bundle instead of delivering a partial one.
// replaceFile writes by rename: os.WriteFile truncates first, and a read
// between the truncation and the write sees an empty (valid) bundle, which
// is not what the test is about.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	must(t, os.WriteFile(tmp, data, 0o644))
	must(t, os.Rename(tmp, path))
}

func TestReadErrorKeepsPreviousBundle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	replaceFile(t, filepath.Join(dir, "ca.crt"), []byte(pemish("A")))
	h := start(t, Options{Dir: dir, PollInterval: 50 * time.Millisecond, MaxFileSize: 1024})
	h.next(deliverWithin)
	// Too large to be a bundle: a read error, not an empty bundle.
	replaceFile(t, filepath.Join(dir, "ca.crt"), []byte(strings.Repeat("x", 2048)))
	h.quiet(quietFor)
	if string(h.w.latest().Bundle) != pemish("A") {
		t.Error("Current() changed after a failed read")
	}
	replaceFile(t, filepath.Join(dir, "ca.crt"), []byte(pemish("B")))
	if got := h.next(deliverWithin); string(got.Bundle) != pemish("B") {
		t.Fatalf("%q", got.Bundle)
	}
}

func TestReadDanglingSymlinkIsAbsent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	must(t, os.Symlink("..data/ca.crt", filepath.Join(dir, "ca.crt")))
	s, err := read(dir, nil, nil, 0)
	if err != nil || !s.DirExists || len(s.Files) != 0 {
		t.Fatalf("%+v %v", s, err)
	}
	s2, err := read(filepath.Join(dir, "missing"), []string{"ca.crt"}, nil, 0)
	if err != nil || s2.DirExists || s2.Hash != s.Hash {
		t.Fatalf("missing dir: %+v %v (hash must equal an empty bundle's)", s2, err)
	}
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	ok := func(Snapshot) {}
	for name, o := range map[string]Options{
		"no dir":         {OnChange: ok},
		"no callback":    {Dir: "/x"},
		"bad pattern":    {Dir: "/x", OnChange: ok, Patterns: []string{"["}},
		"hidden file":    {Dir: "/x", OnChange: ok, Files: []string{"..data"}},
		"path as file":   {Dir: "/x", OnChange: ok, Files: []string{"a/b"}},
		"empty filename": {Dir: "/x", OnChange: ok, Files: []string{""}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	w, err := New(Options{Dir: "/x/", OnChange: ok})
	must(t, err)
	if w.o.Debounce != defaultDebounce || w.o.PollInterval != defaultPollInterval || !slices.Equal(w.o.Patterns, defaultPatterns) || w.o.Dir != "/x" {
		t.Errorf("defaults %+v", w.o)
	}
}

func TestRunTwiceAndCancel(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := New(Options{Dir: dir, OnChange: func(Snapshot) {}})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	// The second Run must come after the first started: wait for that,
	// not 50 ms (a loaded machine may not have run the goroutine yet).
	for started := false; !started; {
		w.mu.Lock()
		started = w.started
		w.mu.Unlock()
		if !started {
			time.Sleep(time.Millisecond)
		}
	}
	if err := w.Run(ctx); err == nil {
		t.Error("second Run succeeded")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(runWithin):
		t.Fatal("Run did not stop")
	}
	// goleak in TestMain checks the fsnotify goroutines are gone.
}
