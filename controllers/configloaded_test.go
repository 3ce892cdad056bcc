package controllers

import (
	"strings"
	"testing"
)

func TestServedGeneration(t *testing.T) {
	for _, c := range []struct {
		kind    kind
		body    string
		gen     int64
		problem string
	}{
		{sidecarKind{}, `{"injector":"mesh","loaded":true,"generation":4,"hash":"ab"}`, 4, ""},
		{sidecarKind{}, `{"injector":"mesh","loaded":false,"generation":0}`, 0, "not loaded"},
		{sidecarKind{}, `{"injector":"other","loaded":true,"generation":4}`, 0, `serves injector "other"`},
		{sidecarKind{}, `{"injector":"mesh","loaded":true,"generation":3,"lastError":"template \"p\": template: p:2: bad"}`, 3, "newer generation rejected: template"},
		{sidecarKind{}, `<html>`, 0, "unreadable"},
		{oversellKind{}, `{"synced":true,"nodeOversells":[{"name":"x","generation":1},{"name":"mesh","generation":7}],"ignored":[]}`, 7, ""},
		{oversellKind{}, `{"synced":true,"nodeOversells":[],"ignored":[{"name":"mesh","generation":2,"reason":"spec.ratios.cpu: bad"}]}`, 0, "ignored: spec.ratios.cpu"},
		{oversellKind{}, `{"synced":false}`, 0, "not synced"},
		{oversellKind{}, `{"synced":true,"nodeOversells":[]}`, 0, "not served"},
	} {
		got := c.kind.ServedGeneration("mesh", []byte(c.body))
		if got.Generation != c.gen || !strings.HasPrefix(got.Problem, c.problem) || (c.problem == "") != (got.Problem == "") {
			t.Errorf("%s %s: %+v, want generation %d problem %q", c.kind.Kind().Short, c.body, got, c.gen, c.problem)
		}
	}
}
