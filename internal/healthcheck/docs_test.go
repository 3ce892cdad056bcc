package healthcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestEveryCheckDocumented: every id a check reports in the table tests
// has its section "#### check-<id>" in docs/cli.md, which the hints link
// to, and no section names an id no check reports.
func TestEveryCheckDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#### check-([a-z-]+)$`).FindAllStringSubmatch(string(raw), -1) {
		documented[m[1]] = true
	}
	seen := map[string]bool{}
	for _, tc := range runCases() {
		f := healthy(t)
		tc.edit(t, &f)
		for _, r := range Run(f) {
			seen[r.ID] = true
		}
	}
	for _, tc := range preCases() {
		f := preFacts(t)
		tc.edit(&f)
		for _, r := range Pre(f) {
			seen[r.ID] = true
		}
	}
	for id := range seen {
		if !documented[id] {
			t.Errorf("check %s has no section check-%s in docs/cli.md", id, id)
		}
	}
	for id := range documented {
		if !seen[id] {
			t.Errorf("docs/cli.md documents check-%s, which no test case reports", id)
		}
	}
}
