package oversell

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// This file reads the few fields the handler needs from an AdmissionReview
// without building the rest: a node object is ~20 KB, mostly images,
// conditions and managedFields, and the review carries two of them.
// Skipped values are validated as RFC 8259 requires (string escapes and
// control characters, number grammar, exact literals, separators and
// nesting), so a malformed body is a 400 wherever the error is; every value
// the handler uses is also decoded strictly. A separate json.Valid pass
// would do the same but costs more than the whole handler (~130 µs on the
// benchmark review, halving TLS throughput).

// syntaxError is malformed JSON; the handler answers 400.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at offset %d: %s", e.off, e.msg)
}

// typeError is well-formed JSON of the wrong shape for a field.
type typeError struct {
	field string
	want  string
}

func (e *typeError) Error() string { return fmt.Sprintf("%s: want %s", e.field, e.want) }

func synErr(off int, msg string) error { return &syntaxError{off: off, msg: msg} }

func skipWS(d []byte, i int) int {
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
	// Escapes present (rare in node objects): walk byte by byte.
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
// a time: strings are most of a node object.
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

// maxDepth bounds nesting, as encoding/json does, so hostile input cannot
// grow the stack without limit.
const maxDepth = 10000

// skipValue returns the index after the value starting at d[i].
func skipValue(d []byte, i int) (int, error) { return skipValueAt(d, i, 0) }

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
	i = skipWS(d, i+1)
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
			i = skipWS(d, ke)
			if i >= len(d) || d[i] != ':' {
				return 0, synErr(i, "expected ':'")
			}
			i = skipWS(d, i+1)
		}
		ve, err := skipValueAt(d, i, depth)
		if err != nil {
			return 0, err
		}
		i = skipWS(d, ve)
		if i >= len(d) {
			return 0, synErr(i, "unexpected end of input")
		}
		switch d[i] {
		case ',':
			i = skipWS(d, i+1)
		case closer:
			return i + 1, nil
		default:
			return 0, synErr(i, fmt.Sprintf("expected ',' or %q", closer))
		}
	}
}

// eachMember calls fn for every member of the object at d[i] with the raw
// key (without quotes) and the value's start; fn returns the value's end,
// usually via skipValue or a decoder. It returns the index after the object.
// null is accepted as an empty object; any other non-object is a typeError
// named field.
func eachMember(d []byte, i int, field string, fn func(key []byte, vs int) (int, error)) (int, error) {
	i = skipWS(d, i)
	if i >= len(d) {
		return 0, synErr(i, "unexpected end of input")
	}
	if d[i] != '{' {
		if bytes.HasPrefix(d[i:], []byte("null")) {
			return i + 4, nil
		}
		if _, err := skipValue(d, i); err != nil {
			return 0, err
		}
		return 0, &typeError{field: field, want: "an object"}
	}
	i = skipWS(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
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
		i = skipWS(d, ke)
		if i >= len(d) || d[i] != ':' {
			return 0, synErr(i, "expected ':'")
		}
		i = skipWS(d, i+1)
		ve, err := fn(key, i)
		if err != nil {
			return 0, err
		}
		i = skipWS(d, ve)
		if i >= len(d) {
			return 0, synErr(i, "unexpected end of input")
		}
		switch d[i] {
		case ',':
			i = skipWS(d, i+1)
		case '}':
			return i + 1, nil
		default:
			return 0, synErr(i, "expected ',' or '}'")
		}
	}
}

// readString decodes the string (or null, as "") at d[i].
func readString(d []byte, i int, field string) (string, int, error) {
	end, err := skipValue(d, i)
	if err != nil {
		return "", 0, err
	}
	switch d[i] {
	case '"':
		raw := d[i+1 : end-1]
		if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) && !hasControl(raw) {
			return string(raw), end, nil
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
	return "", 0, &typeError{field: field, want: "a string"}
}

// unescape decodes the body of a JSON string (RFC 8259 section 7). Invalid
// UTF-8 and lone surrogates become U+FFFD, as in encoding/json; a raw
// control character or a bad escape is an error.
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

// readStringMap decodes an object of strings (or null, as nil).
func readStringMap(d []byte, i int, field string) (map[string]string, int, error) {
	var m map[string]string
	end, err := eachMember(d, i, field, func(key []byte, vs int) (int, error) {
		k, err := memberName(key)
		if err != nil {
			return 0, err
		}
		v, ve, err := readString(d, vs, field)
		if te, ok := err.(*typeError); ok {
			te.field += "." + k // named only on failure: no concatenation per member
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

// memberName turns a raw member name into a string, unescaping if needed.
func memberName(key []byte) (string, error) {
	if bytes.IndexByte(key, '\\') < 0 {
		return string(key), nil
	}
	s, ok := unescape(key)
	if !ok {
		return "", synErr(0, "invalid member name")
	}
	return s, nil
}

// readBool decodes true, false or null (false).
func readBool(d []byte, i int, field string) (bool, int, error) {
	end, err := skipValue(d, i)
	if err != nil {
		return false, 0, err
	}
	switch string(d[i:end]) {
	case "true":
		return true, end, nil
	case "false", "null":
		return false, end, nil
	}
	return false, 0, &typeError{field: field, want: "a boolean"}
}

// readStrings decodes an array of strings (or null).
func readStrings(d []byte, i int, field string) ([]string, int, error) {
	if i < len(d) && d[i] == 'n' {
		_, end, err := readString(d, i, field)
		return nil, end, err
	}
	if i >= len(d) || d[i] != '[' {
		if end, err := skipValue(d, i); err != nil {
			return nil, end, err
		}
		return nil, 0, &typeError{field: field, want: "an array"}
	}
	var out []string
	i = skipWS(d, i+1)
	if i < len(d) && d[i] == ']' {
		return out, i + 1, nil
	}
	for {
		s, end, err := readString(d, i, field)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, s)
		i = skipWS(d, end)
		if i >= len(d) {
			return nil, 0, synErr(i, "unexpected end of input")
		}
		switch d[i] {
		case ',':
			i = skipWS(d, i+1)
		case ']':
			return out, i + 1, nil
		default:
			return nil, 0, synErr(i, "expected ',' or ']'")
		}
	}
}

// parsedReview is what parseReview extracts.
type parsedReview struct {
	apiVersion, kind string
	req              *requestJSON
}

// parseReview reads an AdmissionReview. A syntaxError or a typeError in the
// envelope is returned as err; a typeError inside object or oldObject is
// returned as nodeErr with everything else decoded, because a node of an
// unexpected shape must not turn into a rejected heartbeat.
func parseReview(d []byte) (rv parsedReview, nodeErr, err error) {
	i := skipWS(d, 0)
	if i >= len(d) {
		return rv, nil, synErr(i, "empty body")
	}
	if d[i] != '{' {
		if _, err := skipValue(d, i); err != nil {
			return rv, nil, err
		}
		return rv, nil, &typeError{field: "AdmissionReview", want: "an object"}
	}
	end, err := eachMember(d, i, "AdmissionReview", func(key []byte, vs int) (int, error) {
		switch string(key) {
		case "apiVersion":
			s, end, err := readString(d, vs, "apiVersion")
			rv.apiVersion = s
			return end, err
		case "kind":
			s, end, err := readString(d, vs, "kind")
			rv.kind = s
			return end, err
		case "request":
			if bytes.HasPrefix(d[vs:], []byte("null")) {
				rv.req = nil
				return vs + 4, nil
			}
			rv.req = &requestJSON{}
			return parseRequest(d, vs, rv.req, &nodeErr)
		}
		return skipValue(d, vs)
	})
	if err != nil {
		return rv, nil, err
	}
	if j := skipWS(d, end); j != len(d) {
		return rv, nil, synErr(j, "data after the top-level value")
	}
	return rv, nodeErr, nil
}

func parseRequest(d []byte, i int, req *requestJSON, nodeErr *error) (int, error) {
	return eachMember(d, i, "request", func(key []byte, vs int) (int, error) {
		var err error
		end := 0
		switch string(key) {
		case "uid":
			req.UID, end, err = readString(d, vs, "request.uid")
		case "resource":
			end, err = eachMember(d, vs, "request.resource", func(k []byte, vs int) (int, error) {
				switch string(k) {
				case "group":
					s, e, err := readString(d, vs, "request.resource.group")
					req.Resource.Group = s
					return e, err
				case "resource":
					s, e, err := readString(d, vs, "request.resource.resource")
					req.Resource.Resource = s
					return e, err
				}
				return skipValue(d, vs)
			})
		case "subResource":
			req.SubResource, end, err = readString(d, vs, "request.subResource")
		case "name":
			req.Name, end, err = readString(d, vs, "request.name")
		case "operation":
			req.Operation, end, err = readString(d, vs, "request.operation")
		case "dryRun":
			req.DryRun, end, err = readBool(d, vs, "request.dryRun")
		case "userInfo":
			end, err = eachMember(d, vs, "request.userInfo", func(k []byte, vs int) (int, error) {
				var e int
				var err error
				switch string(k) {
				case "username":
					req.UserInfo.Username, e, err = readString(d, vs, "request.userInfo.username")
				case "groups":
					req.UserInfo.Groups, e, err = readStrings(d, vs, "request.userInfo.groups")
				default:
					e, err = skipValue(d, vs)
				}
				return e, err
			})
		case "object", "oldObject":
			var n nodeJSON
			end, err = parseNode(d, vs, &n)
			if te, ok := err.(*typeError); ok {
				// Keep going: the envelope decides between 400 and an
				// allowed answer with a warning.
				if *nodeErr == nil {
					*nodeErr = te
				}
				end, err = skipValue(d, vs)
			}
			if string(key) == "object" {
				req.Object = n
			} else if d[vs] != 'n' {
				req.OldObject = &n
			}
		default:
			end, err = skipValue(d, vs)
		}
		return end, err
	})
}

// parseNode reads metadata.{name,labels,annotations} and
// status.{capacity,allocatable}; everything else is skipped.
func parseNode(d []byte, i int, n *nodeJSON) (int, error) {
	return eachMember(d, i, "object", func(key []byte, vs int) (int, error) {
		switch string(key) {
		case "metadata":
			return eachMember(d, vs, "metadata", func(k []byte, vs int) (int, error) {
				var e int
				var err error
				switch string(k) {
				case "name":
					n.Metadata.Name, e, err = readString(d, vs, "metadata.name")
				case "labels":
					n.Metadata.Labels, e, err = readStringMap(d, vs, "metadata.labels")
				case "annotations":
					n.Metadata.Annotations, e, err = readStringMap(d, vs, "metadata.annotations")
				default:
					e, err = skipValue(d, vs)
				}
				return e, err
			})
		case "status":
			return eachMember(d, vs, "status", func(k []byte, vs int) (int, error) {
				var e int
				var err error
				switch string(k) {
				case "capacity":
					n.Status.Capacity, e, err = readStringMap(d, vs, "status.capacity")
				case "allocatable":
					n.Status.Allocatable, e, err = readStringMap(d, vs, "status.allocatable")
				default:
					e, err = skipValue(d, vs)
				}
				return e, err
			})
		}
		return skipValue(d, vs)
	})
}
