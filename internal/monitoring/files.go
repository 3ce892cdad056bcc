package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// RulesFile and DashboardFile are the shipped files, relative to the
// repository's root.
const (
	RulesFile     = "config/prometheus/prometheusrule.yaml"
	DashboardFile = "config/grafana/hookwright-dashboard.json"
)

// Expr is one PromQL expression and where it comes from ("alert X",
// `panel "T" target A`).
type Expr struct{ Where, Text string }

// RuleGroups returns spec.groups of the PrometheusRule at path: the groups
// of a Prometheus rules file ({"groups": ...}), as parsed YAML.
func RuleGroups(path string) ([]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pr struct {
		Kind string
		Spec struct {
			Groups []any `json:"groups"`
		}
	}
	if err := yaml.Unmarshal(b, &pr); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if pr.Kind != "PrometheusRule" || len(pr.Spec.Groups) == 0 {
		return nil, fmt.Errorf("%s: kind %q with %d groups, want a PrometheusRule with groups", path, pr.Kind, len(pr.Spec.Groups))
	}
	return pr.Spec.Groups, nil
}

// RuleExprs returns each alert's expression in groups (RuleGroups).
func RuleExprs(groups []any) []Expr {
	var out []Expr
	for _, g := range groups {
		m, _ := g.(map[string]any)
		rules, _ := m["rules"].([]any)
		for _, r := range rules {
			r, _ := r.(map[string]any)
			out = append(out, Expr{fmt.Sprintf("alert %v", r["alert"]), fmt.Sprint(r["expr"])})
		}
	}
	return out
}

// DashboardExprs returns every panel target's expression of the Grafana
// dashboard at path; a dashboard without one is an error.
func DashboardExprs(path string) ([]Expr, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Expr
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, Expr{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no expressions", path)
	}
	return out, nil
}

var (
	stringRe   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	matcherRe  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	groupingRe = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	identRe    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	keywords   = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// MetricNames returns the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges and grouping labels
// are cut, that are not a keyword or called as a function. It is a lexical
// cut, enough for the expressions of the shipped files (TestMetricNames).
func MetricNames(e string) []string {
	e = stringRe.ReplaceAllString(e, `""`)
	e = matcherRe.ReplaceAllString(e, " ")
	e = groupingRe.ReplaceAllString(e, " ")
	seen := map[string]bool{}
	var out []string
	for _, loc := range identRe.FindAllStringIndex(e, -1) {
		id := e[loc[0]:loc[1]]
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // the exponent or unit of a number
		}
		if keywords[strings.ToLower(id)] || strings.HasPrefix(strings.TrimLeft(e[loc[1]:], " \t\n"), "(") || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, id)
	}
	return out
}
