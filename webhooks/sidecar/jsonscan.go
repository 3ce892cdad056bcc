package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// A minimal JSON splitter for input that has already been validated (the
// handler's AdmissionReview decode validates every byte of the pod).
// encoding/json re-validates and re-scans a value on every Unmarshal; for a
// pod with thousands of env vars that dominated the handler's cost. These
// functions only find value boundaries: they never panic, report structural
// damage (truncation, a missing colon or comma) as an error, and return
// sub-slices of the input without copying.

var errTruncated = errors.New("unexpected end of JSON input")

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '"':
			return j + 1, nil
		case '\\':
			j++ // skip the escaped byte
		}
	}
	return 0, errTruncated
}

// skipValue returns the index after the JSON value starting at or after b[i].
func skipValue(b []byte, i int) (int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return 0, errTruncated
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				j, err := skipString(b, i)
				if err != nil {
					return 0, err
				}
				i = j
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
			i++
		}
		return 0, errTruncated
	}
	j := i
	for j < len(b) {
		c := b[j]
		if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\t' || c == '\r' {
			break
		}
		j++
	}
	if j == i {
		return 0, fmt.Errorf("unexpected %q at offset %d", b[i], i)
	}
	return j, nil
}

// splitObject returns the members of the JSON object b as raw values.
// null yields a nil map.
func splitObject(b []byte) (map[string]json.RawMessage, error) {
	i := skipWS(b, 0)
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return nil, nil
	}
	if i >= len(b) || b[i] != '{' {
		return nil, errors.New("not a JSON object")
	}
	m := make(map[string]json.RawMessage, 8)
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return m, nil
	}
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return nil, fmt.Errorf("expected object key at offset %d", i)
		}
		end, err := skipString(b, i)
		if err != nil {
			return nil, err
		}
		key, err := unquoteKey(b[i:end])
		if err != nil {
			return nil, err
		}
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, fmt.Errorf("expected ':' at offset %d", i)
		}
		start := skipWS(b, i+1)
		end, err = skipValue(b, start)
		if err != nil {
			return nil, err
		}
		m[key] = b[start:end:end]
		i = skipWS(b, end)
		if i >= len(b) {
			return nil, errTruncated
		}
		if b[i] == '}' {
			return m, nil
		}
		if b[i] != ',' {
			return nil, fmt.Errorf("expected ',' or '}' at offset %d", i)
		}
		i++
	}
}

// splitArray returns the elements of the JSON array b as raw values. null
// yields nil.
func splitArray(b []byte) ([]json.RawMessage, error) {
	i := skipWS(b, 0)
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return nil, nil
	}
	if i >= len(b) || b[i] != '[' {
		return nil, errors.New("not a JSON array")
	}
	var out []json.RawMessage
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, nil
	}
	for {
		start := skipWS(b, i)
		end, err := skipValue(b, start)
		if err != nil {
			return nil, err
		}
		out = append(out, b[start:end:end])
		i = skipWS(b, end)
		if i >= len(b) {
			return nil, errTruncated
		}
		if b[i] == ']' {
			return out, nil
		}
		if b[i] != ',' {
			return nil, fmt.Errorf("expected ',' or ']' at offset %d", i)
		}
		i++
	}
}

// unquoteKey decodes a JSON string; plain ASCII takes a fast path, anything
// else goes through encoding/json (which maps invalid UTF-8 to U+FFFD).
func unquoteKey(q []byte) (string, error) {
	plain := true
	for _, c := range q {
		if c == '\\' || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		return string(q[1 : len(q)-1]), nil
	}
	var s string
	err := json.Unmarshal(q, &s)
	return s, err
}

// nameOf returns the "name" member of a JSON object, "" when absent.
func nameOf(b []byte) (string, error) {
	m, err := splitObject(b)
	if err != nil {
		return "", err
	}
	r, ok := m["name"]
	if !ok || len(r) == 0 || r[0] != '"' {
		return "", nil
	}
	return unquoteKey(r)
}
