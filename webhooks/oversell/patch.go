package oversell

import (
	"strings"

	"github.com/hookwright/hookwright/webhooks/jsonscan"
)

// appendPatch appends to dst the RFC 6902 JSON patch that turns obj into
// what d prescribes, and reports whether any operation was written. It only
// touches /status/allocatable/{cpu,memory} and the engine's annotations; a
// value equal in quantity to the current one ("8" vs "8000m") is left alone
// so steady-state writes carry no patch. dst gets "[...]" only when ops > 0.
func appendPatch(dst []byte, obj NodeState, d Decision) ([]byte, bool) {
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
		dst = jsonscan.AppendString(dst, path)
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
		dst = jsonscan.AppendString(dst, d.Effective[r].String())
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
				dst = jsonscan.AppendString(dst, k)
				dst = append(dst, ':')
				dst = jsonscan.AppendString(dst, d.Annotations[i])
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
				dst = jsonscan.AppendString(dst, want)
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
