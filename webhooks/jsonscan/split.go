package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Object returns the members of the JSON object b as raw values, as
// json.Unmarshal into a map[string]json.RawMessage would (a repeated name
// keeps its last value), but without copying them. null yields a nil map;
// any other non-object is an error, as is anything after the object.
func Object(b []byte) (map[string]json.RawMessage, error) {
	i := SkipWS(b, 0)
	if i < len(b) && b[i] != '{' && !isNull(b, i) {
		return nil, errors.New("not a JSON object")
	}
	var m map[string]json.RawMessage
	if i < len(b) && b[i] == '{' {
		m = make(map[string]json.RawMessage, 8)
	}
	end, err := EachMember(b, i, "object", func(key []byte, vs int) (int, error) {
		k, err := MemberName(key)
		if err != nil {
			return 0, err
		}
		ve, err := SkipValue(b, vs)
		if err != nil {
			return 0, err
		}
		m[k] = b[vs:ve:ve]
		return ve, nil
	})
	if err != nil {
		return nil, err
	}
	return m, End(b, end)
}

// Array returns the elements of the JSON array b as raw values, without
// copying them. null yields nil; any other non-array is an error, as is
// anything after the array.
func Array(b []byte) ([]json.RawMessage, error) {
	i := SkipWS(b, 0)
	if i < len(b) && b[i] != '[' && !isNull(b, i) {
		return nil, errors.New("not a JSON array")
	}
	var out []json.RawMessage
	end, err := EachElement(b, i, "array", func(vs int) (int, error) {
		ve, err := SkipValue(b, vs)
		if err != nil {
			return 0, err
		}
		out = append(out, b[vs:ve:ve])
		return ve, nil
	})
	if err != nil {
		return nil, err
	}
	return out, End(b, end)
}

// NamedArray returns the elements of the JSON array b as raw values, as
// Array does, and the "name" member of each, in one pass (see NamedArrayAt).
func NamedArray(b []byte) ([]json.RawMessage, []string, error) {
	i := SkipWS(b, 0)
	if i < len(b) && b[i] != '[' && !isNull(b, i) {
		return nil, nil, errors.New("not a JSON array")
	}
	out, names, end, err := NamedArrayAt(b, i, "")
	if err != nil {
		return nil, nil, err
	}
	return out, names, End(b, end)
}

// NamedArrayAt reads the array (or null) at d[i]: its elements as raw
// values and the "name" member of each: "" for an element that is null or
// whose name is absent or not a string (a repeated name keeps its last
// value, as encoding/json does). It returns the index after the array. A
// value that is not an array, or an element that is neither an object nor
// null, is a *TypeError naming field ("" names none).
func NamedArrayAt(d []byte, i int, field string) (elems []json.RawMessage, names []string, end int, err error) {
	end, err = EachElement(d, i, field, func(vs int) (int, error) {
		name := ""
		ve, err := EachMember(d, vs, field, func(key []byte, vs int) (int, error) {
			if !isName(key) {
				return SkipValue(d, vs)
			}
			if d[vs] != '"' {
				name = ""
				return SkipValue(d, vs)
			}
			s, ve, err := ReadString(d, vs, field)
			name = s
			return ve, err
		})
		if err != nil {
			return 0, err
		}
		elems = append(elems, d[vs:ve:ve])
		names = append(names, name)
		return ve, nil
	})
	if err != nil {
		return nil, nil, 0, err
	}
	return elems, names, end, nil
}

func isName(key []byte) bool {
	if bytes.IndexByte(key, '\\') < 0 {
		return string(key) == "name"
	}
	k, err := MemberName(key)
	return err == nil && k == "name"
}
