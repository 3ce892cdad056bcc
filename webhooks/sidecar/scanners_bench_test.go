package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/valyala/fastjson"
)

// splitResult is what parsePod and list take from a pod: the top-level and
// spec members as raw JSON and the container names.
type splitResult struct {
	top, spec map[string]json.RawMessage
	names     []string
}

// BenchmarkScanners splits the benchmark pods as parsePod and list do
// (top-level and spec members raw, the containers and their names) with the
// shared scanner and with two well-kept tokenizers. jsontext validates
// everything, as ours does, and hands out raw values (sub-slices of a
// bytes.Buffer it reads in place). fastjson cannot return a member's raw
// bytes without marshalling it again, so it only parses and reads the
// names: a lower bound for it.
func BenchmarkScanners(b *testing.B) {
	for _, bp := range benchPods[:3] {
		pod := bp.pod()
		want, err := jsSplit(pod)
		if err != nil {
			b.Fatal(err)
		}
		run := func(name string, split func([]byte) (splitResult, error), cmp func(got splitResult) bool) {
			b.Run(name+"/"+bp.name, func(b *testing.B) {
				if got, err := split(pod); err != nil || !cmp(got) {
					b.Fatalf("%s split %v %v, want %v", name, got.names, err, want.names)
				}
				b.SetBytes(int64(len(pod)))
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, err := split(pod); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		full := func(got splitResult) bool {
			return rawEqual(got.top, want.top) && rawEqual(got.spec, want.spec) && slices.Equal(got.names, want.names)
		}
		run("jsonscan", jsSplit, full)
		var dec jsontext.Decoder
		run("jsontext", func(d []byte) (splitResult, error) { return jtSplit(&dec, d) }, full)
		var p fastjson.Parser
		run("fastjson", func(d []byte) (splitResult, error) {
			v, err := p.ParseBytes(d)
			if err != nil {
				return splitResult{}, err
			}
			var r splitResult
			for _, c := range v.GetArray("spec", "containers") {
				r.names = append(r.names, string(c.GetStringBytes("name")))
			}
			return r, nil
		}, func(got splitResult) bool { return slices.Equal(got.names, want.names) })
	}
}

func rawEqual(a, b map[string]json.RawMessage) bool {
	return len(a) == len(b) && !slices.ContainsFunc(slices.Collect(func(yield func(string) bool) {
		for k := range a {
			if !yield(k) {
				return
			}
		}
	}), func(k string) bool { return !bytes.Equal(a[k], b[k]) })
}

// jsSplit is parsePod's pass (podDoc.split) and list's names.
func jsSplit(pod []byte) (r splitResult, err error) {
	d := &podDoc{}
	if err := d.split(pod); err != nil {
		return r, err
	}
	rl, _ := d.readList("containers")
	return splitResult{top: d.top, spec: d.spec, names: rl.names}, rl.err
}

var errShape = errors.New("unexpected JSON shape")

// jtSplit does podDoc.split's one pass with a jsontext.Decoder: raw values
// are sub-slices of pod (a bytes.Buffer is read in place; InputOffset
// marks where each value ends).
func jtSplit(dec *jsontext.Decoder, pod []byte) (r splitResult, err error) {
	dec.Reset(bytes.NewBuffer(pod), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	r.top, r.spec = map[string]json.RawMessage{}, map[string]json.RawMessage{}
	err = jtObject(dec, pod, r.top, func(k string) (bool, error) {
		if k != "spec" || dec.PeekKind() != '{' {
			return false, nil
		}
		return true, jtObject(dec, pod, r.spec, func(k string) (bool, error) {
			if k != "containers" || dec.PeekKind() != '[' {
				return false, nil
			}
			if _, err := dec.ReadToken(); err != nil {
				return true, err
			}
			for dec.PeekKind() != ']' {
				name := ""
				err := jtObject(dec, pod, nil, func(k string) (bool, error) {
					if k != "name" || dec.PeekKind() != '"' {
						return false, nil
					}
					tok, err := dec.ReadToken()
					if err == nil {
						name = tok.String()
					}
					return true, err
				})
				if err != nil {
					return true, err
				}
				r.names = append(r.names, name)
			}
			_, err := dec.ReadToken()
			return true, err
		})
	})
	return r, err
}

// jtObject reads the object next in dec, storing each member's raw value in
// m (when not nil); fn may consume a member's value itself (true).
func jtObject(dec *jsontext.Decoder, src []byte, m map[string]json.RawMessage, fn func(string) (bool, error)) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	if tok.Kind() != '{' {
		return errShape
	}
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return err
		}
		name := tok.String() // before the next read voids tok
		start := dec.InputOffset()
		done, err := fn(name)
		if err != nil {
			return err
		}
		if !done {
			if err := dec.SkipValue(); err != nil {
				return err
			}
		}
		if m != nil {
			raw := bytes.TrimLeft(src[start:dec.InputOffset()], " \t\r\n:")
			m[name] = json.RawMessage(raw)
		}
	}
	_, err = dec.ReadToken()
	return err
}
