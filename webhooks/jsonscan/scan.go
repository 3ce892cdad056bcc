// Package jsonscan is the one JSON scanner of the webhook servers: it finds
// and decodes the few values a handler needs in an AdmissionReview without
// building the rest (a node is about 20 KB, mostly images, conditions and
// managedFields; a pod with thousands of env vars is megabytes).
//
// The contract, for every function: the input is untrusted; every byte a
// function passes over is validated as RFC 8259 requires (string escapes
// and control characters, number grammar, exact literals, separators and
// nesting up to maxDepth), so malformed JSON is reported wherever it is;
// nothing panics; raw values are sub-slices of the input, never copies;
// failures are a *SyntaxError (malformed JSON, with its offset) or a
// *TypeError (well-formed JSON of the wrong shape for a field). Strings
// decode as encoding/json decodes them (invalid UTF-8 and lone surrogates
// become U+FFFD). Offsets are byte indexes into the slice passed in.
//
// A json.Valid pass before encoding/json would give the same guarantees but
// costs more than the oversell handler's whole review. BenchmarkScanners in
// webhooks/oversell and webhooks/sidecar put this scanner beside
// encoding/json/jsontext (github.com/go-json-experiment/json) and
// github.com/valyala/fastjson on the servers' own inputs.
//
// The package imports only the standard library; it must not import
// Kubernetes or any other hookwright package.
package jsonscan

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// SyntaxError is malformed JSON at byte Offset; a handler answers 400.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at offset %d: %s", e.Offset, e.Msg)
}

// TypeError is well-formed JSON of the wrong shape for Field, which should
// have been Want ("a string", "an object", ...).
type TypeError struct {
	Field string
	Want  string
}

func (e *TypeError) Error() string {
	if e.Field == "" {
		return "want " + e.Want
	}
	return fmt.Sprintf("%s: want %s", e.Field, e.Want)
}

func synErr(off int, msg string) error { return &SyntaxError{Offset: off, Msg: msg} }

// maxDepth bounds nesting, as encoding/json does, so hostile input cannot
// grow the stack without limit.
const maxDepth = 10000

// SkipWS returns the index of the first non-whitespace byte at or after i.
func SkipWS(d []byte, i int) int {
	for i < len(d) {
		switch d[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index after the string starting at d[i] == '"',
// rejecting raw control characters and invalid escapes.
func skipString(d []byte, i int) (int, error) {
	start := i
	i++
	j := bytes.IndexByte(d[i:], '"')
	if j < 0 {
		return 0, synErr(start, "unterminated string")
	}
	seg := d[i : i+j]
	if bytes.IndexByte(seg, '\\') < 0 {
		if hasControlFast(seg) {
			return 0, synErr(start, "control character in string")
		}
		return i + j + 1, nil
	}
	// Escapes present (rare in Kubernetes objects): walk byte by byte.
	for i < len(d) {
		switch c := d[i]; {
		case c == '"':
			return i + 1, nil
		case c < 0x20:
			return 0, synErr(i, "control character in string")
		case c == '\\':
			if i+1 >= len(d) {
				return 0, synErr(start, "unterminated string")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if _, ok := hex4(d, i+2); !ok {
					return 0, synErr(i, "invalid \\u escape")
				}
				i += 6
			default:
				return 0, synErr(i, "invalid escape")
			}
		default:
			i++
		}
	}
	return 0, synErr(start, "unterminated string")
}

// hasControlFast reports whether b holds a byte below 0x20, eight bytes at
// a time: strings are most of a Kubernetes object.
func hasControlFast(b []byte) bool {
	const highs, below = 0x8080808080808080, 0x20 * 0x0101010101010101
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		if (x-below)&^x&highs != 0 { // some byte < 0x20 (exact for n ≤ 128)
			return true
		}
		b = b[8:]
	}
	return hasControl(b)
}

// SkipValue returns the index after the value starting at d[i] (no leading
// whitespace), validating all of it.
func SkipValue(d []byte, i int) (int, error) { return skipValueAt(d, i, 0) }

func skipValueAt(d []byte, i, depth int) (int, error) {
	if i >= len(d) {
		return 0, synErr(i, "unexpected end of input")
	}
	switch c := d[i]; {
	case c == '"':
		return skipString(d, i)
	case c == '{' || c == '[':
		if depth >= maxDepth {
			return 0, synErr(i, "nesting too deep")
		}
		return skipComposite(d, i, depth+1)
	case c == 't':
		return skipLiteral(d, i, "true")
	case c == 'f':
		return skipLiteral(d, i, "false")
	case c == 'n':
		return skipLiteral(d, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return skipNumber(d, i)
	}
	return 0, synErr(i, fmt.Sprintf("unexpected character %q", d[i]))
}

func skipLiteral(d []byte, i int, lit string) (int, error) {
	if !bytes.HasPrefix(d[i:], []byte(lit)) {
		return 0, synErr(i, "invalid literal")
	}
	return i + len(lit), nil
}

// isNull reports whether the value at d[i] is the literal null.
func isNull(d []byte, i int) bool { return bytes.HasPrefix(d[i:], []byte("null")) }

// skipNumber checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; what
// follows is checked by the caller's grammar.
func skipNumber(d []byte, i int) (int, error) {
	start := i
	digits := func() bool {
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		return i > j
	}
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case !digits():
		return 0, synErr(start, "invalid number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			return 0, synErr(start, "invalid number")
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			return 0, synErr(start, "invalid number")
		}
	}
	return i, nil
}

// skipComposite skips an object or array, validating every member, element
// and separator.
func skipComposite(d []byte, i, depth int) (int, error) {
	obj := d[i] == '{'
	closer := byte(']')
	if obj {
		closer = '}'
	}
	i = SkipWS(d, i+1)
	if i < len(d) && d[i] == closer {
		return i + 1, nil
	}
	for {
		if obj {
			if i >= len(d) || d[i] != '"' {
				return 0, synErr(i, "expected a member name")
			}
			ke, err := skipString(d, i)
			if err != nil {
				return 0, err
			}
			i = SkipWS(d, ke)
			if i >= len(d) || d[i] != ':' {
				return 0, synErr(i, "expected ':'")
			}
			i = SkipWS(d, i+1)
		}
		ve, err := skipValueAt(d, i, depth)
		if err != nil {
			return 0, err
		}
		if i, err = next(d, ve, closer); err != nil || i < 0 {
			return -i, err
		}
	}
}

// next reads the separator after a member or element ending at end: the
// index of the next one after a comma, or minus the index after the closer.
func next(d []byte, end int, closer byte) (int, error) {
	i := SkipWS(d, end)
	if i >= len(d) {
		return 0, synErr(i, "unexpected end of input")
	}
	switch d[i] {
	case ',':
		return SkipWS(d, i+1), nil
	case closer:
		return -(i + 1), nil
	}
	return 0, synErr(i, fmt.Sprintf("expected ',' or %q", closer))
}

// EachMember calls fn for every member of the object at d[i] (leading
// whitespace allowed) with the raw name (without quotes, still escaped:
// see MemberName) and the index where its value starts; fn returns the
// index after the value, usually through SkipValue or a Read function. It
// returns the index after the object. null is an empty object; any other
// value is a *TypeError naming field.
func EachMember(d []byte, i int, field string, fn func(key []byte, vs int) (int, error)) (int, error) {
	i, done, err := enter(d, i, '{', '}', field, "an object")
	if err != nil || done {
		return i, err
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return 0, synErr(i, "expected a member name")
		}
		ke, err := skipString(d, i)
		if err != nil {
			return 0, err
		}
		key := d[i+1 : ke-1]
		i = SkipWS(d, ke)
		if i >= len(d) || d[i] != ':' {
			return 0, synErr(i, "expected ':'")
		}
		ve, err := fn(key, SkipWS(d, i+1))
		if err != nil {
			return 0, err
		}
		if i, err = next(d, ve, '}'); err != nil || i < 0 {
			return -i, err
		}
	}
}

// EachElement calls fn for every element of the array at d[i] (leading
// whitespace allowed) with the index where it starts; fn returns the index
// after it. It returns the index after the array. null is an empty array;
// any other value is a *TypeError naming field.
func EachElement(d []byte, i int, field string, fn func(vs int) (int, error)) (int, error) {
	i, done, err := enter(d, i, '[', ']', field, "an array")
	if err != nil || done {
		return i, err
	}
	for {
		ve, err := fn(i)
		if err != nil {
			return 0, err
		}
		if i, err = next(d, ve, ']'); err != nil || i < 0 {
			return -i, err
		}
	}
}

// enter starts reading the object or array (opener ... closer) at d[i],
// after whitespace: it returns the index of the first member or element,
// or done and the index after the value for null and for an empty one.
// Any other value is a *TypeError naming field.
func enter(d []byte, i int, opener, closer byte, field, want string) (int, bool, error) {
	i = SkipWS(d, i)
	if i >= len(d) {
		return 0, false, synErr(i, "unexpected end of input")
	}
	if d[i] != opener {
		if isNull(d, i) {
			return i + 4, true, nil
		}
		if _, err := SkipValue(d, i); err != nil {
			return 0, false, err
		}
		return 0, false, &TypeError{Field: field, Want: want}
	}
	i = SkipWS(d, i+1)
	if i < len(d) && d[i] == closer {
		return i + 1, true, nil
	}
	return i, false, nil
}

// End checks that only whitespace follows the top-level value ending at end.
func End(d []byte, end int) error {
	if j := SkipWS(d, end); j != len(d) {
		return synErr(j, "data after the top-level value")
	}
	return nil
}

// ReadString decodes the string (or null, as "") at d[i].
func ReadString(d []byte, i int, field string) (string, int, error) {
	end, err := SkipValue(d, i)
	if err != nil {
		return "", 0, err
	}
	switch d[i] {
	case '"':
		raw := d[i+1 : end-1]
		if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
			return string(raw), end, nil // SkipValue rejected control characters
		}
		s, ok := unescape(raw)
		if !ok {
			return "", 0, synErr(i, "invalid string")
		}
		return s, end, nil
	case 'n':
		if end-i == 4 {
			return "", end, nil
		}
	}
	return "", 0, &TypeError{Field: field, Want: "a string"}
}

// unescape decodes the body of a JSON string (RFC 8259 section 7). Invalid
// UTF-8 and lone surrogates become U+FFFD, as in encoding/json; a raw
// control character or a bad escape is reported as false.
func unescape(raw []byte) (string, bool) {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c < 0x20:
			return "", false
		case c == '\\':
			if i+1 >= len(raw) {
				return "", false
			}
			switch e := raw[i+1]; e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := hex4(raw, i+2)
				if !ok {
					return "", false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if r2, ok := hex4(raw, i+2); ok && i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
				continue
			default:
				return "", false
			}
			i += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			out = utf8.AppendRune(out, r)
			i += size
		}
	}
	return string(out), true
}

// hex4 reads four hex digits at raw[i:].
func hex4(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// MemberName decodes a raw member name as EachMember passes it.
func MemberName(key []byte) (string, error) {
	if bytes.IndexByte(key, '\\') < 0 && utf8.Valid(key) {
		return string(key), nil
	}
	s, ok := unescape(key)
	if !ok {
		return "", synErr(0, "invalid member name")
	}
	return s, nil
}

// ReadStringMap decodes an object of strings (or null, as nil).
func ReadStringMap(d []byte, i int, field string) (map[string]string, int, error) {
	var m map[string]string
	end, err := EachMember(d, i, field, func(key []byte, vs int) (int, error) {
		k, err := MemberName(key)
		if err != nil {
			return 0, err
		}
		v, ve, err := ReadString(d, vs, field)
		if te, ok := err.(*TypeError); ok {
			te.Field += "." + k // named only on failure: no concatenation per member
		}
		if err != nil {
			return 0, err
		}
		if m == nil {
			m = make(map[string]string, 16)
		}
		m[k] = v
		return ve, nil
	})
	return m, end, err
}

// ReadBool decodes true, false or null (false).
func ReadBool(d []byte, i int, field string) (bool, int, error) {
	end, err := SkipValue(d, i)
	if err != nil {
		return false, 0, err
	}
	switch string(d[i:end]) {
	case "true":
		return true, end, nil
	case "false", "null":
		return false, end, nil
	}
	return false, 0, &TypeError{Field: field, Want: "a boolean"}
}

// ReadStrings decodes an array of strings (or null, as nil).
func ReadStrings(d []byte, i int, field string) ([]string, int, error) {
	var out []string
	end, err := EachElement(d, i, field, func(vs int) (int, error) {
		s, end, err := ReadString(d, vs, field)
		out = append(out, s)
		return end, err
	})
	if err != nil {
		return nil, 0, err
	}
	return out, end, nil
}
