package bundle

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dockerfile is the Dockerfile as instructions, continuation lines joined.
func dockerfile(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	cur := ""
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur += strings.TrimSuffix(trimmed, `\`) + " "
			continue
		}
		out = append(out, strings.Join(strings.Fields(cur+trimmed), " "))
		cur = ""
	}
	return out
}

// TestDockerfile checks what the image build must keep, since CI has no
// Docker engine: a Go 1.26 builder with module and build cache mounts, the
// binary built by hack/build.sh (static, -trimpath, version ldflags) from
// every directory ./cmd's packages live in, and a distroless static
// nonroot runtime running as 65532:65532.
func TestDockerfile(t *testing.T) {
	ins := dockerfile(t)
	joined := strings.Join(ins, "\n")
	for _, want := range []string{
		"FROM golang:1.26 AS builder",
		"RUN --mount=type=cache,target=/go/pkg/mod go mod download",
		"RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build GOOS=${TARGETOS} GOARCH=${TARGETARCH} hack/build.sh hookwright ${VERSION} ${GIT_COMMIT}",
		"COPY hack/build.sh hack/build.sh",
		"FROM gcr.io/distroless/static:nonroot",
		"COPY --from=builder /workspace/hookwright /hookwright",
		"USER 65532:65532",
		`ENTRYPOINT ["/hookwright"]`,
	} {
		found := false
		for _, in := range ins {
			if in == want {
				found = true
			}
		}
		if !found {
			t.Errorf("Dockerfile lacks the instruction %q; it has:\n%s", want, joined)
		}
	}
	// Every directory holding a package the binary is built from is copied
	// into the builder (a new top-level package dir would break the image).
	copied := map[string]bool{}
	for _, in := range ins {
		if f := strings.Fields(in); f[0] == "COPY" && len(f) == 3 && !strings.HasPrefix(f[1], "--") {
			copied[strings.TrimSuffix(f[1], "/")] = true
		}
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "./cmd")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	need := map[string]bool{}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(abs, dir)
		if err != nil {
			t.Fatal(err)
		}
		need[strings.Split(filepath.ToSlash(rel), "/")[0]] = true
	}
	var missing []string
	for d := range need {
		if !copied[d] {
			missing = append(missing, d)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the Dockerfile does not COPY %v, which ./cmd is built from", missing)
	}
	if !copied["go.mod"] && !strings.Contains(joined, "COPY go.mod go.sum ./") {
		t.Error("the Dockerfile does not copy go.mod and go.sum")
	}
}

// TestMakeBuildUsesBuildScript: `make build` runs the script the Dockerfile
// runs, so the two cannot drift apart.
func TestMakeBuildUsesBuildScript(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^build:.*\n((?:\t.*\n)+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Makefile has no build target")
	}
	if recipe := strings.TrimSpace(string(m[1])); recipe != "hack/build.sh $(BIN)/hookwright v$(VERSION) $(GIT_COMMIT)" {
		t.Errorf("make build runs %q, want hack/build.sh (the Dockerfile's build command)", recipe)
	}
}

// TestBuildScript runs hack/build.sh as the Dockerfile does and checks the
// result: a static ELF (no interpreter, no dynamic section, so it runs on
// distroless/static), built with -trimpath, carrying the version.
func TestBuildScript(t *testing.T) {
	out := filepath.Join(t.TempDir(), "hookwright")
	// A cold build takes minutes on a loaded 2-core machine; stop it (and
	// its compiler children, in its process group) before the test binary's
	// own timeout would leave it running.
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "hack/build.sh", out, "v9.8.7-test", "abc1234")
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+goarch(t), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/build.sh: %v\n%s", err, b)
	}
	t.Logf("hack/build.sh took %v", time.Since(start).Round(time.Second))
	f, err := elf.Open(out)
	if err != nil {
		t.Fatalf("not an ELF binary: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v program header: it is not static (CGO_ENABLED=0 lost?)", p.Type)
		}
	}
	if f.Section(".symtab") != nil {
		t.Error("binary has a symbol table: -ldflags -s lost")
	}
	ver, err := exec.Command(out, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("hookwright version: %v\n%s", err, ver)
	}
	if !strings.Contains(string(ver), "v9.8.7-test") || !strings.Contains(string(ver), "abc1234") {
		t.Errorf("hookwright version = %q, want the version and commit passed to hack/build.sh", ver)
	}
	abs, _ := filepath.Abs(root)
	if data, err := os.ReadFile(out); err == nil && strings.Contains(string(data), abs+"/") {
		t.Errorf("binary contains the build path %s: -trimpath lost", abs)
	}
}

func goarch(t *testing.T) string {
	t.Helper()
	b, err := exec.Command("go", "env", "GOARCH").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
