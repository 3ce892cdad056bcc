package oversell

import (
	"strings"
	"unicode/utf8"
)

// AppendPatch appends to dst the RFC 6902 JSON patch that turns obj into
// what d prescribes, and reports whether any operation was written. It only
// touches /status/allocatable/{cpu,memory} and the engine's annotations; a
// value equal in quantity to the current one ("8" vs "8000m") is left alone
// so steady-state writes carry no patch. dst gets "[...]" only when ops > 0.
func AppendPatch(dst []byte, obj NodeState, d Decision) ([]byte, bool) {
	if !d.Apply {
		return dst, false
	}
	start := len(dst)
	dst = append(dst, '[')
	n := 0
	op := func(kind, path string) {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = append(dst, `{"op":"`...)
		dst = append(dst, kind...)
		dst = append(dst, `","path":`...)
		dst = appendJSONString(dst, path)
	}

	for r := Resource(0); r < numResources; r++ {
		if !d.Present[r] {
			continue
		}
		if cur, ok := optQuantity(obj.Allocatable, resourceNames[r]); ok && cur.Cmp(d.Effective[r]) == 0 {
			continue
		}
		op("replace", "/status/allocatable/"+resourceNames[r])
		dst = append(dst, `,"value":`...)
		dst = appendJSONString(dst, d.Effective[r].String())
		dst = append(dst, '}')
	}

	if obj.Annotations == nil {
		// No annotations map: one add creates it with every value.
		if !d.Restore {
			op("add", "/metadata/annotations")
			dst = append(dst, `,"value":{`...)
			first := true
			for i, k := range annotationKeys {
				if d.Annotations[i] == "" {
					continue
				}
				if !first {
					dst = append(dst, ',')
				}
				first = false
				dst = appendJSONString(dst, k)
				dst = append(dst, ':')
				dst = appendJSONString(dst, d.Annotations[i])
			}
			dst = append(dst, "}}"...)
		}
	} else {
		for i, k := range annotationKeys {
			cur, found := obj.Annotations[k]
			want := d.Annotations[i]
			switch {
			case want == "" && found:
				op("remove", annotationPath(k))
				dst = append(dst, '}')
			case want != "" && (!found || cur != want):
				// "add" on an existing member replaces it (RFC 6902 4.1).
				op("add", annotationPath(k))
				dst = append(dst, `,"value":`...)
				dst = appendJSONString(dst, want)
				dst = append(dst, '}')
			}
		}
	}
	if n == 0 {
		return dst[:start], false
	}
	return append(dst, ']'), true
}

// annotationPath is the JSON pointer of an annotation key; "/" in the key
// is escaped as "~1" and "~" as "~0" (RFC 6901 section 3).
func annotationPath(key string) string {
	key = strings.ReplaceAll(key, "~", "~0")
	key = strings.ReplaceAll(key, "/", "~1")
	return "/metadata/annotations/" + key
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as encoding/json does.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20:
				switch c {
				case '\n':
					dst = append(dst, '\\', 'n')
				case '\r':
					dst = append(dst, '\\', 'r')
				case '\t':
					dst = append(dst, '\\', 't')
				default:
					dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
				}
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
