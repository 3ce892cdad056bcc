package doclinks

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, seen from this package's directory.
const root = "../.."

var (
	fence      = regexp.MustCompile("(?ms)^ *```.*?^ *```")
	inlineCode = regexp.MustCompile("`[^`\n]*`")
	link       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading    = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
)

// pages are the Markdown files whose links are checked.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "test", "README.md")}, docs...)
}

// anchor is the id GitHub gives a heading's text.
func anchor(text string) string {
	text = strings.ToLower(strings.ReplaceAll(text, "`", ""))
	var b strings.Builder
	for _, r := range text {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// anchors are the ids of a Markdown text's headings, fenced blocks aside.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
		a := anchor(m[1])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// links are a Markdown text's link targets, code aside.
func links(text string) []string {
	text = inlineCode.ReplaceAllString(fence.ReplaceAllString(text, ""), "")
	var out []string
	for _, m := range link.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestRelativeLinksResolve(t *testing.T) {
	for _, page := range pages(t) {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links(string(raw)) {
			if strings.Contains(l, "://") || strings.HasPrefix(l, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(l, "#")
			target := page
			if file != "" {
				target = filepath.Join(filepath.Dir(page), file)
			}
			body, err := os.ReadFile(target)
			if err != nil {
				if info, serr := os.Stat(target); serr == nil && info.IsDir() && frag == "" {
					continue
				}
				t.Errorf("%s: link %q: %v", page, l, err)
				continue
			}
			if frag != "" && !anchors(string(body))[frag] {
				t.Errorf("%s: link %q: %s has no heading with anchor %q", page, l, target, frag)
			}
		}
	}
}

func TestAnchor(t *testing.T) {
	for text, want := range map[string]string{
		"Live check of each webhook (`WebhookReachable`)":       "live-check-of-each-webhook-webhookreachable",
		"OLM without Docker: `operator-sdk run bundle` by hand": "olm-without-docker-operator-sdk-run-bundle-by-hand",
		"Server policy: the operator is nobody's deputy":        "server-policy-the-operator-is-nobodys-deputy",
		"Timings (2026-12-05)":                                  "timings-2026-12-05",
		"`--ca-dir`":                                            "--ca-dir",
	} {
		if got := anchor(text); got != want {
			t.Errorf("anchor(%q) = %q, want %q", text, got, want)
		}
	}
	got := anchors("# A\n```sh\n# not a heading\n```\n## A\n")
	if !got["a"] || !got["a-1"] || got["not-a-heading"] {
		t.Errorf("anchors = %v", got)
	}
}

var (
	// token is a backquoted word of test/README.md.
	token = regexp.MustCompile("`([^`\\s]+)`")
	// repoPath is a token naming something in the repository.
	repoPath = regexp.MustCompile(`^(api|bundle|cmd|config|controllers|docs|hack|internal|test|webhooks)/[\w./-]*$`)
	testName = regexp.MustCompile(`^(Test|Example|Benchmark|Fuzz)\w*(/\w+)?$`)
)

// Every path test/README.md names exists, and every test function it
// names is defined in the _test.go file named before it on its line (a
// subtest's name appears in that file).
func TestTestMapNamesWhatExists(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "test", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for n, line := range strings.Split(string(raw), "\n") {
		var file string
		for _, m := range token.FindAllStringSubmatch(line, -1) {
			tok := m[1]
			switch {
			case repoPath.MatchString(tok):
				if _, err := os.Stat(filepath.Join(root, tok)); err != nil {
					t.Errorf("test/README.md:%d: %s does not exist", n+1, tok)
				}
				file = ""
				if strings.HasSuffix(tok, "_test.go") {
					file = tok
				}
			case testName.MatchString(tok):
				if file == "" {
					t.Errorf("test/README.md:%d: %s follows no _test.go file", n+1, tok)
					continue
				}
				src, err := os.ReadFile(filepath.Join(root, file))
				if err != nil {
					continue
				}
				fn, sub, _ := strings.Cut(tok, "/")
				if !regexp.MustCompile(`(?m)^func ` + fn + `\(`).Match(src) {
					t.Errorf("test/README.md:%d: %s has no func %s", n+1, file, fn)
				}
				if sub != "" && !strings.Contains(string(src), `"`+sub+`"`) {
					t.Errorf("test/README.md:%d: %s has no subtest %q", n+1, file, sub)
				}
				named++
			}
		}
	}
	if named < 50 {
		t.Errorf("test/README.md names %d tests; the map should name each feature's", named)
	}
}
