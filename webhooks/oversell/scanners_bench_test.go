package oversell

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/valyala/fastjson"
)

// BenchmarkScanners reads what the handler needs from the benchmark review
// (uid, resource, operation, user, and name, labels, annotations, capacity
// and allocatable of both nodes) with the shared scanner and with two
// well-kept tokenizers, so the choice of a hand-written scanner stays
// checkable. jsontext validates everything, as ours does; fastjson's
// parser checks the structure but leaves string escapes unchecked until a
// string is read, so its figure is a lower bound.
func BenchmarkScanners(b *testing.B) {
	body := benchReview(b)
	want, _, err := parseReview(body)
	if err != nil {
		b.Fatal(err)
	}
	// The hold check's record is ours alone.
	want.req.Object.scan, want.req.OldObject.scan = nodeScan{}, nodeScan{}
	run := func(name string, read func([]byte) (*requestJSON, error)) {
		b.Run(name, func(b *testing.B) {
			got, err := read(body)
			if err == nil {
				// The hold check's record is ours alone.
				got.Object.scan = nodeScan{}
				if got.OldObject != nil {
					got.OldObject.scan = nodeScan{}
				}
			}
			if err != nil || !reflect.DeepEqual(got, want.req) {
				b.Fatalf("%s read %+v, %v\nwant %+v", name, got, err, want.req)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := read(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("jsonscan", func(d []byte) (*requestJSON, error) {
		rv, _, err := parseReview(d)
		return rv.req, err
	})
	var dec jsontext.Decoder
	var buf bytes.Buffer
	run("jsontext", func(d []byte) (*requestJSON, error) {
		buf.Reset()
		buf.Write(d)
		// encoding/json's semantics, which the handler keeps: repeated
		// names and invalid UTF-8 are accepted.
		dec.Reset(&buf, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
		return jtReview(&dec)
	})
	var p fastjson.Parser
	run("fastjson", func(d []byte) (*requestJSON, error) {
		v, err := p.ParseBytes(d)
		if err != nil {
			return nil, err
		}
		return fjReview(v.Get("request")), nil
	})
}

var errShape = errors.New("unexpected JSON shape")

// jtObject calls fn with each member name of the object (or null) next in d;
// fn must consume the value.
func jtObject(d *jsontext.Decoder, fn func(name string) error) error {
	tok, err := d.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		return nil
	case '{':
	default:
		return errShape
	}
	for d.PeekKind() != '}' {
		name, err := d.ReadToken()
		if err != nil {
			return err
		}
		if err := fn(name.String()); err != nil {
			return err
		}
	}
	_, err = d.ReadToken()
	return err
}

func jtString(d *jsontext.Decoder, dst *string) error {
	tok, err := d.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case '"':
		*dst = tok.String()
	case 'n':
	default:
		return errShape
	}
	return nil
}

func jtStringMap(d *jsontext.Decoder, dst *map[string]string) error {
	return jtObject(d, func(k string) error {
		if *dst == nil {
			*dst = make(map[string]string, 16)
		}
		var v string
		err := jtString(d, &v)
		(*dst)[k] = v
		return err
	})
}

func jtReview(d *jsontext.Decoder) (*requestJSON, error) {
	req := &requestJSON{}
	err := jtObject(d, func(k string) error {
		if k != "request" {
			return d.SkipValue()
		}
		return jtObject(d, func(k string) error {
			switch k {
			case "uid":
				return jtString(d, &req.UID)
			case "name":
				return jtString(d, &req.Name)
			case "operation":
				return jtString(d, &req.Operation)
			case "subResource":
				return jtString(d, &req.SubResource)
			case "dryRun":
				tok, err := d.ReadToken()
				req.DryRun = err == nil && tok.Kind() == 't'
				return err
			case "resource":
				return jtObject(d, func(k string) error {
					switch k {
					case "group":
						return jtString(d, &req.Resource.Group)
					case "resource":
						return jtString(d, &req.Resource.Resource)
					}
					return d.SkipValue()
				})
			case "userInfo":
				return jtObject(d, func(k string) error {
					switch k {
					case "username":
						return jtString(d, &req.UserInfo.Username)
					case "groups":
						if _, err := d.ReadToken(); err != nil {
							return err
						}
						for d.PeekKind() != ']' {
							var g string
							if err := jtString(d, &g); err != nil {
								return err
							}
							req.UserInfo.Groups = append(req.UserInfo.Groups, g)
						}
						_, err := d.ReadToken()
						return err
					}
					return d.SkipValue()
				})
			case "object":
				return jtNode(d, &req.Object)
			case "oldObject":
				req.OldObject = &nodeJSON{}
				return jtNode(d, req.OldObject)
			}
			return d.SkipValue()
		})
	})
	if err != nil {
		return nil, err
	}
	_, err = d.ReadToken() // io.EOF, or data after the value
	if err != nil && err.Error() != "EOF" {
		return nil, err
	}
	return req, nil
}

func jtNode(d *jsontext.Decoder, n *nodeJSON) error {
	return jtObject(d, func(k string) error {
		switch k {
		case "metadata":
			return jtObject(d, func(k string) error {
				switch k {
				case "name":
					return jtString(d, &n.Metadata.Name)
				case "labels":
					return jtStringMap(d, &n.Metadata.Labels)
				case "annotations":
					return jtStringMap(d, &n.Metadata.Annotations)
				}
				return d.SkipValue()
			})
		case "status":
			return jtObject(d, func(k string) error {
				switch k {
				case "capacity":
					return jtStringMap(d, &n.Status.Capacity)
				case "allocatable":
					return jtStringMap(d, &n.Status.Allocatable)
				}
				return d.SkipValue()
			})
		}
		return d.SkipValue()
	})
}

func fjStringMap(v *fastjson.Value) map[string]string {
	o := v.GetObject()
	if o == nil {
		return nil
	}
	m := make(map[string]string, o.Len())
	o.Visit(func(k []byte, v *fastjson.Value) { m[string(k)] = string(v.GetStringBytes()) })
	return m
}

func fjNode(v *fastjson.Value) nodeJSON {
	var n nodeJSON
	md, st := v.Get("metadata"), v.Get("status")
	n.Metadata.Name = string(md.GetStringBytes("name"))
	n.Metadata.Labels = fjStringMap(md.Get("labels"))
	n.Metadata.Annotations = fjStringMap(md.Get("annotations"))
	n.Status.Capacity = fjStringMap(st.Get("capacity"))
	n.Status.Allocatable = fjStringMap(st.Get("allocatable"))
	return n
}

func fjReview(r *fastjson.Value) *requestJSON {
	req := &requestJSON{
		UID:         string(r.GetStringBytes("uid")),
		Name:        string(r.GetStringBytes("name")),
		Operation:   string(r.GetStringBytes("operation")),
		SubResource: string(r.GetStringBytes("subResource")),
		DryRun:      r.GetBool("dryRun"),
	}
	req.Resource.Group = string(r.GetStringBytes("resource", "group"))
	req.Resource.Resource = string(r.GetStringBytes("resource", "resource"))
	req.UserInfo.Username = string(r.GetStringBytes("userInfo", "username"))
	for _, g := range r.GetArray("userInfo", "groups") {
		req.UserInfo.Groups = append(req.UserInfo.Groups, string(g.GetStringBytes()))
	}
	req.Object = fjNode(r.Get("object"))
	if o := r.Get("oldObject"); o != nil && o.Type() != fastjson.TypeNull {
		n := fjNode(o)
		req.OldObject = &n
	}
	return req
}
