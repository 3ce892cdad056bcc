package sidecar

import (
	"context"
	"errors"
	"math"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Functions whose CPU is the product of their inputs within one call are
// denied before they run past maxCallWork; normal calls render as sprig's.
// The bombs are the reviewer's: unbounded, the regex ones ran 9 s to over
// 40 s and uniq minutes, in one uninterruptible call.
func TestCallWork(t *testing.T) {
	longTimeout(t)
	for _, tc := range []struct{ name, body, want, limit string }{
		{"regexMatch", `{{ regexMatch "^a.c$" "abc" }}{{ mustRegexMatch "x" "abc" }}`, "truefalse", ""},
		{"regexFind", `{{ regexFind "[0-9]+" "ab12cd34" }}`, "12", ""},
		{"regexFindAll", `{{ regexFindAll "[0-9]+" "ab12cd34e5" -1 | join "," }}|{{ regexFindAll "[0-9]+" "ab12cd34e5" 2 | join "," }}`, "12,34,5|12,34", ""},
		{"regexFindAll anchors", `{{ regexFindAll "(?m)^\\w" "ab\ncd" -1 | join "," }}|{{ regexFindAll "\\bx" "xx x" -1 | len }}|{{ regexFindAll "^a" "aaa" -1 | len }}`, "a,c|2|1", ""},
		{"regexSplit", `{{ regexSplit "z+" "pizza" -1 | join "," }}|{{ regexSplit "" "abc" -1 | join "," }}|{{ regexSplit "a" "banana" 2 | join "," }}`, "pi,a|a,b,c|b,nana", ""},
		{"regexReplaceAll", `{{ regexReplaceAll "a(x*)b" "-ab-axxb-" "${1}W" }}|{{ regexReplaceAll "a*" "baaac" "-" }}`, "-W-xxW-|-b-c-", ""},
		{"regexReplaceAllLiteral", `{{ regexReplaceAllLiteral "a(x*)b" "-ab-axxb-" "${1}" }}`, "-${1}-${1}-", ""},
		{"regex on a long input", `{{ regexReplaceAll "[^a-z]" (repeat 20000 "a-") "" | len }}`, "20000", ""},
		{"uniq", `{{ list 1 2 1 3 2 | uniq | join "," }}|{{ list 1 2 3 | mustUniq | len }}`, "1,2,3|3", ""},
		{"without", `{{ without (list 1 2 3 1) 1 3 | join "," }}|{{ mustWithout (list 1 2) 2 | len }}`, "2|1", ""},
		{"uniq of 100", `{{ until 100 | uniq | len }}`, "100", ""},

		{"review regexMatch", `{{ $p := repeat 15000 "(a|b)" }}{{ $s := repeat 400000 "ab" }}{{ regexMatch $p $s }}`, "", "MaxRegexBytes"},
		{"review regexFindAll", `{{ $p := repeat 15000 "(a|b)?" }}{{ $s := repeat 400000 "ab" }}{{ regexFindAll $p $s -1 | len }}`, "", "MaxRegexBytes"},
		{"review regexSplit", `{{ $p := repeat 15000 "(a|b)?" }}{{ $s := repeat 400000 "ab" }}{{ regexSplit $p $s -1 | len }}`, "", "MaxRegexBytes"},
		{"review uniq", `{{ $l := until 60000 }}{{ uniq $l | len }}`, "", "MaxCallWork"},
		{"regexMatch bomb", `{{ regexMatch (repeat 600 "(a|b)") (repeat 400000 "ab") }}`, "", "MaxCallWork"},
		{"mustRegexMatch bomb", `{{ mustRegexMatch (repeat 600 "(a|b)") (repeat 400000 "ab") }}`, "", "MaxCallWork"},
		{"regexFind bomb", `{{ regexFind (repeat 600 "(a|b)?") (repeat 400000 "ab") }}`, "", "MaxCallWork"},
		{"mustRegexFind bomb", `{{ mustRegexFind (repeat 600 "(a|b)?") (repeat 400000 "ab") }}`, "", "MaxCallWork"},
		{"regexFindAll bomb", `{{ regexFindAll (repeat 600 "(a|b)?") (repeat 400000 "ab") -1 | len }}`, "", "MaxCallWork"},
		{"mustRegexFindAll bomb", `{{ mustRegexFindAll (repeat 600 "(a|b)?") (repeat 400000 "ab") -1 | len }}`, "", "MaxCallWork"},
		{"regexSplit bomb", `{{ regexSplit (repeat 600 "(a|b)?") (repeat 400000 "ab") -1 | len }}`, "", "MaxCallWork"},
		{"mustRegexSplit bomb", `{{ mustRegexSplit (repeat 600 "(a|b)?") (repeat 400000 "ab") -1 | len }}`, "", "MaxCallWork"},
		{"regexReplaceAll bomb", `{{ regexReplaceAll (repeat 600 "(a|b)?") (repeat 400000 "ab") "x" | len }}`, "", "MaxCallWork"},
		{"mustRegexReplaceAll bomb", `{{ mustRegexReplaceAll (repeat 600 "(a|b)?") (repeat 400000 "ab") "" | len }}`, "", "MaxCallWork"},
		{"regexReplaceAllLiteral bomb", `{{ regexReplaceAllLiteral (repeat 600 "(a|b)?") (repeat 400000 "ab") "x" | len }}`, "", "MaxCallWork"},
		{"mustRegexReplaceAllLiteral bomb", `{{ mustRegexReplaceAllLiteral (repeat 600 "(a|b)?") (repeat 400000 "ab") "x" | len }}`, "", "MaxCallWork"},
		{"mustUniq bomb", `{{ until 60000 | mustUniq | len }}`, "", "MaxCallWork"},
		{"without bomb", `{{ $l := until 30000 }}{{ without $l` + strings.Repeat(" 7", 20000) + ` | len }}`, "", "MaxCallWork"},
		{"mustWithout bomb", `{{ $l := until 30000 }}{{ mustWithout $l` + strings.Repeat(" 7", 20000) + ` | len }}`, "", "MaxCallWork"},
		{"uniq of large elements", `{{ $e := until 500 }}{{ $l := list }}{{ range until 60 }}{{ $l = append $l $e }}{{ end }}{{ uniq $l | len }}`, "", "MaxCallWork"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Compile(bombCR(tc.body))
			if tc.limit == "" {
				if err != nil {
					t.Fatal(err)
				}
				p, err := cfg.renderOne(context.Background(), cfg.templates["bomb"], trialData(cfg, false))
				if err != nil {
					t.Fatal(err)
				}
				if got := p.annotations["x"]; got != tc.want {
					t.Errorf("rendered %q, want %q", got, tc.want)
				}
				return
			}
			var le *limitError
			if !errors.As(err, &le) || le.Limit != tc.limit {
				t.Fatalf("error %v, want a %s LimitError", err, tc.limit)
			}
			for _, want := range []string{`template "bomb"`, tc.limit} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// A FindAll whose every search is within maxCallWork but rescans the rest
// of the input from every match (quadratic: about 5 s unbounded) stops at
// maxRenderCPU (shortened here), since the clock is read between searches.
func TestRegexAllMatchesStopAtDeadline(t *testing.T) {
	shortCPU(t, time.Millisecond)
	cfg, err := Compile(bombCR(`x`))
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{`regexFindAll "a*b|a" (repeat 20000 "a") -1 | len`, `regexSplit "a*b|a" (repeat 20000 "a") -1 | len`, `regexReplaceAll "a*b|a" (repeat 20000 "a") "x" | len`} {
		cfg.templates["bomb"] = mustBomb(t, "metadata:\n  annotations:\n    x: \"{{ "+fn+" }}\"\n")
		_, err = cfg.renderOne(context.Background(), cfg.templates["bomb"], trialData(cfg, false))
		var le *limitError
		if !errors.As(err, &le) || le.Limit != "MaxRenderCPUTime" {
			t.Fatalf("%s: got %v", fn, err)
		}
	}
}

// The all-matches functions, which search one match at a time, return what
// regexp's own FindAll, Split and ReplaceAll return.
func TestRegexAllMatchesAsRegexp(t *testing.T) {
	patterns := []string{``, `a`, `a*`, `a*?`, `(a|b)?`, `^`, `$`, `^a`, `(?m)^.`, `(?m)$`, `\b`, `\B`, `\bx\w*`, `x*`,
		`[^a-z]`, `(?i)AB`, `(\w)(\d)?`, `é+`, `.`, `\A.`, `(?U)a+`, `\Qa)\E`, `a*b|a`}
	inputs := []string{"", "a", "aaa", "abab", "xx x xyz", "ab\ncd\n", "aéé-é", "A1b2AB", "\xffa\xe2\x82", "a)a)", "baaac"}
	for _, p := range patterns {
		re := regexp.MustCompile(p)
		for _, s := range inputs {
			for _, n := range []int{-1, 0, 1, 2} {
				got, err := boundRegexFindAll(nil, p, s, n)
				if err != nil {
					t.Fatal(err)
				}
				if want := re.FindAllString(s, n); !reflect.DeepEqual(got, want) {
					t.Errorf("FindAll(%q, %q, %d) = %q, want %q", p, s, n, got, want)
				}
				got, err = boundRegexSplit(nil, p, s, n)
				if err != nil {
					t.Fatal(err)
				}
				if want := re.Split(s, n); !reflect.DeepEqual(got, want) {
					t.Errorf("Split(%q, %q, %d) = %q, want %q", p, s, n, got, want)
				}
			}
			for _, repl := range []string{"", "<$0>", "${1}z"} {
				got, err := boundRegexReplace(nil, p, s, repl, false)
				if err != nil {
					t.Fatal(err)
				}
				if want := re.ReplaceAllString(s, repl); got != want {
					t.Errorf("ReplaceAll(%q, %q, %q) = %q, want %q", p, s, repl, got, want)
				}
				got, err = boundRegexReplace(nil, p, s, repl, true)
				if err != nil {
					t.Fatal(err)
				}
				if want := re.ReplaceAllLiteralString(s, repl); got != want {
					t.Errorf("ReplaceAllLiteral(%q, %q, %q) = %q, want %q", p, s, repl, got, want)
				}
			}
		}
	}
}

// One call at maxCallWork, in the costliest shapes found: an NFA search
// whose every step walks the whole program (the longest pattern, or the
// most groups a replacement may expand), and uniq.
func BenchmarkCallWork(b *testing.B) {
	atBudget := func(b *testing.B, p string) string {
		r, err := compileRegex("bench", p, "")
		if err != nil {
			b.Fatal(err)
		}
		s := strings.Repeat("ab", int(maxCallWork/r.insts)/2-1)
		if _, err := compileRegex("bench", p, s); err != nil {
			b.Fatal(err)
		}
		b.Logf("%d instructions × %d bytes = %d work units", r.insts, len(s), r.insts*int64(len(s)+1))
		return s
	}
	long := strings.Repeat("(a|b)?", maxRegexBytes/6)
	groups := strings.Repeat("(a|b)?", maxRegexGroups)
	for _, bc := range []struct {
		name, pattern string
		call          func(p, s string) error
	}{
		{"regexFindAll", long, func(p, s string) error { _, err := boundRegexFindAll(nil, p, s, -1); return err }},
		{"regexSplit", long, func(p, s string) error { _, err := boundRegexSplit(nil, p, s, -1); return err }},
		{"regexReplaceAllLiteral", long, func(p, s string) error { _, err := boundRegexReplace(nil, p, s, "x", true); return err }},
		{"regexReplaceAll 64 groups", groups, func(p, s string) error { _, err := boundRegexReplace(nil, p, s, "${64}", false); return err }},
		{"regexFind no match", strings.Repeat("(a|b)", maxRegexBytes/5-1) + "c", func(p, s string) error { _, err := boundRegexFind(nil, p, s); return err }},
		{"regexMatch no match", strings.Repeat("(a|b)", maxRegexBytes/5-1) + "c", func(p, s string) error { _, err := boundRegexMatch(nil, p, s); return err }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := atBudget(b, bc.pattern)
			for b.Loop() {
				if err := bc.call(bc.pattern, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("uniq", func(b *testing.B) {
		// n × n × 24 measured bytes / 16 ≈ maxCallWork.
		l := make([]any, int(math.Sqrt(maxCallWork*16/24)))
		for i := range l {
			l[i] = i
		}
		if err := checkPairs("uniq", l, l); err != nil {
			b.Fatal(err)
		}
		uniq := FuncMap()["uniq"].(func(any) []any)
		for b.Loop() {
			uniq(l)
		}
	})
}
