package sidecar

import (
	"fmt"
	"reflect"
	"regexp"
	"regexp/syntax"
	"unicode/utf8"
)

// callWorkError is a function call whose cost, counted before it runs,
// passes maxCallWork.
func callWorkError(what string, work int64) error {
	return &limitError{Limit: "MaxCallWork", Max: maxCallWork, Unit: "work units",
		What: fmt.Sprintf("%s (%d work units)", what, work)}
}

// boundRegexp is a pattern compiled once for one call, with its program
// size, the factor of its search cost.
type boundRegexp struct {
	name  string
	re    *regexp.Regexp
	tree  *syntax.Regexp
	insts int64
	// after matches one rune then the pattern: searching s[p:] with it,
	// where s[p] is the rune before pos, finds the next match at or after
	// pos with the same context (^, \b) the pattern has there in s.
	after *regexp.Regexp
}

// compileRegex compiles pattern for a call of name on s and fails when
// one search of s could pass maxCallWork: RE2's searches are linear in
// the program's instructions times the input's bytes, and cannot be
// interrupted.
func compileRegex(name, pattern, s string) (*boundRegexp, error) {
	if len(pattern) > maxRegexBytes {
		return nil, &limitError{Limit: "MaxRegexBytes", Max: maxRegexBytes, Unit: "bytes", What: name + "'s pattern"}
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, err
	}
	tree, err := syntax.Parse(pattern, syntax.Perl) // regexp.Compile's flags
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(tree.Simplify())
	if err != nil {
		return nil, err
	}
	r := &boundRegexp{name: name, re: re, tree: tree, insts: int64(len(prog.Inst))}
	if work := r.insts * int64(len(s)+1); work > maxCallWork {
		return nil, callWorkError(fmt.Sprintf("%s of a %d-instruction pattern on %d bytes", name, r.insts, len(s)), work)
	}
	return r, nil
}

// searchFrom returns the leftmost match at or after pos in s, as
// FindStringSubmatchIndex's indexes into s (FindStringIndex's unless
// groups: a search's cost grows with the groups it records), or nil.
func (r *boundRegexp) searchFrom(s string, pos int, groups bool) ([]int, error) {
	find := (*regexp.Regexp).FindStringIndex
	if groups {
		find = (*regexp.Regexp).FindStringSubmatchIndex
	}
	if pos == 0 {
		return find(r.re, s), nil
	}
	if r.after == nil {
		re, err := regexp.Compile(`(?s:.)(?:` + r.tree.String() + `)`)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		r.after = re
	}
	// The rune before pos starts at p; past invalid UTF-8 the backward and
	// forward decodings may disagree, and then the search cannot resume.
	_, w := utf8.DecodeLastRuneInString(s[:pos])
	p := pos - w
	if _, fw := utf8.DecodeRuneInString(s[p:]); fw != w {
		return nil, fmt.Errorf("%s: cannot resume the search at byte %d of invalid UTF-8", r.name, pos)
	}
	m := find(r.after, s[p:])
	if m == nil {
		return nil, nil
	}
	_, w = utf8.DecodeRuneInString(s[p+m[0]:])
	for i := range m {
		if m[i] >= 0 {
			m[i] += p
		}
	}
	m[0] += w
	return m, nil
}

// allMatches is regexp's FindAll loop (at most n matches, all when n < 0),
// one search at a time: each search is within maxCallWork (compileRegex)
// and the render's clock and context are read between them, since a
// pattern whose higher-priority branch outlives its match rescans the rest
// of s from every match (a*b|a on a long run of a's).
func (r *boundRegexp) allMatches(st *renderState, s string, n int, groups bool, deliver func([]int) error) error {
	if n < 0 {
		n = len(s) + 1
	}
	for pos, i, prevEnd := 0, 0, -1; i < n && pos <= len(s); {
		if pos > 0 && st != nil {
			if err := st.checkTime(); err != nil {
				return err
			}
		}
		m, err := r.searchFrom(s, pos, groups)
		if err != nil {
			return err
		}
		if m == nil {
			break
		}
		accept := true
		if m[1] == pos {
			// An empty match right after the previous one is not a match;
			// move on one rune.
			if m[0] == prevEnd {
				accept = false
			}
			if pos < len(s) {
				_, w := utf8.DecodeRuneInString(s[pos:])
				pos += w
			} else {
				pos++
			}
		} else {
			pos = m[1]
		}
		prevEnd = m[1]
		if accept {
			if err := deliver(m); err != nil {
				return err
			}
			i++
		}
	}
	return nil
}

// boundRegexMatch is sprig's mustRegexMatch within maxCallWork.
func boundRegexMatch(st *renderState, pattern, s string) (bool, error) {
	if err := st.step(); err != nil {
		return false, err
	}
	r, err := compileRegex("regexMatch", pattern, s)
	if err != nil {
		return false, err
	}
	return r.re.MatchString(s), nil
}

// boundRegexFind is sprig's mustRegexFind within maxCallWork.
func boundRegexFind(st *renderState, pattern, s string) (string, error) {
	if err := st.step(); err != nil {
		return "", err
	}
	r, err := compileRegex("regexFind", pattern, s)
	if err != nil {
		return "", err
	}
	return r.re.FindString(s), nil
}

// boundRegexFindAll is sprig's mustRegexFindAll, one search at a time.
func boundRegexFindAll(st *renderState, pattern, s string, n int) ([]string, error) {
	if err := st.step(); err != nil {
		return nil, err
	}
	r, err := compileRegex("regexFindAll", pattern, s)
	if err != nil {
		return nil, err
	}
	var out []string
	size := 0
	err = r.allMatches(st, s, n, false, func(m []int) error {
		size += m[1] - m[0] + 16
		if size > maxValueBytes {
			return valueLimitError("regexFindAll's result")
		}
		out = append(out, s[m[0]:m[1]])
		return nil
	})
	return out, err
}

// boundRegexSplit is sprig's mustRegexSplit (regexp's Split), one search
// at a time.
func boundRegexSplit(st *renderState, pattern, s string, n int) ([]string, error) {
	if err := st.step(); err != nil {
		return nil, err
	}
	r, err := compileRegex("regexSplit", pattern, s)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	if len(pattern) > 0 && len(s) == 0 {
		return []string{""}, nil
	}
	out := []string{}
	beg, end, size := 0, 0, 0
	errDone := fmt.Errorf("done")
	err = r.allMatches(st, s, n, false, func(m []int) error {
		if n > 0 && len(out) == n-1 {
			return errDone
		}
		end = m[0]
		if m[1] != 0 {
			size += end - beg + 16
			if size > maxValueBytes {
				return valueLimitError("regexSplit's result")
			}
			out = append(out, s[beg:end])
		}
		beg = m[1]
		return nil
	})
	if err != nil && err != errDone {
		return nil, err
	}
	if end != len(s) {
		out = append(out, s[beg:])
	}
	return out, nil
}

// boundRegexReplace is sprig's regexReplaceAll(Literal), one search at a
// time: the output grows match by match and stops past maxValueBytes.
func boundRegexReplace(st *renderState, pattern, s, repl string, literal bool) (string, error) {
	if err := st.step(); err != nil {
		return "", err
	}
	r, err := compileRegex("regexReplaceAll", pattern, s)
	if err != nil {
		return "", err
	}
	if !literal && r.re.NumSubexp() > maxRegexGroups {
		return "", fmt.Errorf("regexReplaceAll: more than %d groups", maxRegexGroups)
	}
	var out []byte
	last, count := 0, 0
	err = r.allMatches(st, s, -1, !literal, func(m []int) error {
		if count++; count > maxRegexMatches && repl != "" {
			return fmt.Errorf("regexReplaceAll: more than %d matches", maxRegexMatches)
		}
		out = append(out, s[last:m[0]]...)
		if literal {
			out = append(out, repl...)
		} else {
			out = r.re.ExpandString(out, repl, s, m)
		}
		last = m[1]
		if len(out) > maxValueBytes {
			return valueLimitError("regexReplaceAll's result")
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	out = append(out, s[last:]...)
	if len(out) > maxValueBytes {
		return "", valueLimitError("regexReplaceAll's result")
	}
	return string(out), nil
}

// checkPairs fails when comparing every element of list with every element
// of against (sprig's uniq and without call reflect.DeepEqual on each
// pair) could pass maxCallWork. A comparison costs at most the smaller
// value's size, so the work is the element count of one side times the
// measured size of the other, in units of 16 bytes (a scalar element).
func checkPairs(name string, list, against any) error {
	n := sliceLen(list)
	m := sliceLen(against)
	if n == 0 || m == 0 {
		return nil
	}
	sl, _ := measure(list, maxValueBytes)
	sa, _ := measure(against, maxValueBytes)
	work := min(int64(n)*int64(sa), int64(m)*int64(sl)) / 16
	if work > maxCallWork {
		return callWorkError(fmt.Sprintf("%s on %d × %d elements", name, n, m), work)
	}
	return nil
}

func sliceLen(v any) int {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice || rv.Kind() == reflect.Array {
		return rv.Len()
	}
	return 0
}
