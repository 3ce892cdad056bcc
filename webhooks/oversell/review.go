package oversell

import (
	"bytes"

	"github.com/hookwright/hookwright/webhooks/jsonscan"
)

// This file reads the few fields the handler needs from an AdmissionReview
// with the shared scanner (webhooks/jsonscan), without building the rest:
// a node object is ~20 KB, mostly images, conditions and managedFields, and
// the review carries two of them. Every skipped value is validated, so a
// malformed body is a 400 wherever the error is.

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
	i := jsonscan.SkipWS(d, 0)
	if i >= len(d) {
		return rv, nil, &jsonscan.SyntaxError{Offset: i, Msg: "empty body"}
	}
	if d[i] != '{' {
		if _, err := jsonscan.SkipValue(d, i); err != nil {
			return rv, nil, err
		}
		return rv, nil, &jsonscan.TypeError{Field: "AdmissionReview", Want: "an object"}
	}
	end, err := jsonscan.EachMember(d, i, "AdmissionReview", func(key []byte, vs int) (int, error) {
		switch string(key) {
		case "apiVersion":
			s, end, err := jsonscan.ReadString(d, vs, "apiVersion")
			rv.apiVersion = s
			return end, err
		case "kind":
			s, end, err := jsonscan.ReadString(d, vs, "kind")
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
		return jsonscan.SkipValue(d, vs)
	})
	if err != nil {
		return rv, nil, err
	}
	if err := jsonscan.End(d, end); err != nil {
		return rv, nil, err
	}
	return rv, nodeErr, nil
}

func parseRequest(d []byte, i int, req *requestJSON, nodeErr *error) (int, error) {
	return jsonscan.EachMember(d, i, "request", func(key []byte, vs int) (int, error) {
		var err error
		end := 0
		switch string(key) {
		case "uid":
			req.UID, end, err = jsonscan.ReadString(d, vs, "request.uid")
		case "resource":
			end, err = jsonscan.EachMember(d, vs, "request.resource", func(k []byte, vs int) (int, error) {
				switch string(k) {
				case "group":
					s, e, err := jsonscan.ReadString(d, vs, "request.resource.group")
					req.Resource.Group = s
					return e, err
				case "resource":
					s, e, err := jsonscan.ReadString(d, vs, "request.resource.resource")
					req.Resource.Resource = s
					return e, err
				}
				return jsonscan.SkipValue(d, vs)
			})
		case "subResource":
			req.SubResource, end, err = jsonscan.ReadString(d, vs, "request.subResource")
		case "name":
			req.Name, end, err = jsonscan.ReadString(d, vs, "request.name")
		case "operation":
			req.Operation, end, err = jsonscan.ReadString(d, vs, "request.operation")
		case "dryRun":
			req.DryRun, end, err = jsonscan.ReadBool(d, vs, "request.dryRun")
		case "userInfo":
			end, err = jsonscan.EachMember(d, vs, "request.userInfo", func(k []byte, vs int) (int, error) {
				var e int
				var err error
				switch string(k) {
				case "username":
					req.UserInfo.Username, e, err = jsonscan.ReadString(d, vs, "request.userInfo.username")
				case "groups":
					req.UserInfo.Groups, e, err = jsonscan.ReadStrings(d, vs, "request.userInfo.groups")
				default:
					e, err = jsonscan.SkipValue(d, vs)
				}
				return e, err
			})
		case "object", "oldObject":
			var n nodeJSON
			end, err = parseNode(d, vs, &n)
			if te, ok := err.(*jsonscan.TypeError); ok {
				// Keep going: the envelope decides between 400 and an
				// allowed answer with a warning.
				if *nodeErr == nil {
					*nodeErr = te
				}
				end, err = jsonscan.SkipValue(d, vs)
			}
			if string(key) == "object" {
				req.Object = n
			} else if d[vs] != 'n' {
				req.OldObject = &n
			}
		default:
			end, err = jsonscan.SkipValue(d, vs)
		}
		return end, err
	})
}

// parseNode reads metadata.{name,labels,annotations} and
// status.{capacity,allocatable}; everything else is skipped, but recorded
// in n.scan for the hold check (hold.go): the raw bytes of every member
// except status.allocatable and status.conditions (managedFields without
// their time), and each condition's members with lastHeartbeatTime apart.
func parseNode(d []byte, i int, n *nodeJSON) (int, error) {
	// About 45 members on a kubelet-registered node with four managers;
	// sized once rather than grown.
	n.scan = nodeScan{ok: true, residue: make([]member, 0, 48)}
	return jsonscan.EachMember(d, i, "object", func(key []byte, vs int) (int, error) {
		switch string(key) {
		case "metadata":
			return jsonscan.EachMember(d, vs, "metadata", func(k []byte, vs int) (int, error) {
				var e int
				var err error
				switch string(k) {
				case "name":
					n.Metadata.Name, e, err = jsonscan.ReadString(d, vs, "metadata.name")
				case "labels":
					n.Metadata.Labels, e, err = jsonscan.ReadStringMap(d, vs, "metadata.labels")
				case "annotations":
					n.Metadata.Annotations, e, err = jsonscan.ReadStringMap(d, vs, "metadata.annotations")
				case "managedFields":
					return parseManagedFields(d, vs, &n.scan)
				default:
					e, err = jsonscan.SkipValue(d, vs)
				}
				if err == nil {
					n.scan.keep('m', k, d[vs:e])
				}
				return e, err
			})
		case "status":
			return jsonscan.EachMember(d, vs, "status", func(k []byte, vs int) (int, error) {
				var e int
				var err error
				switch string(k) {
				case "capacity":
					n.Status.Capacity, e, err = jsonscan.ReadStringMap(d, vs, "status.capacity")
				case "allocatable":
					n.Status.Allocatable, e, err = jsonscan.ReadStringMap(d, vs, "status.allocatable")
					return e, err
				case "conditions":
					return parseConditions(d, vs, &n.scan)
				default:
					e, err = jsonscan.SkipValue(d, vs)
				}
				if err == nil {
					n.scan.keep('s', k, d[vs:e])
				}
				return e, err
			})
		}
		e, err := jsonscan.SkipValue(d, vs)
		if err == nil {
			n.scan.keep('t', key, d[vs:e])
		}
		return e, err
	})
}

// parseManagedFields records metadata.managedFields in sc without the
// entries' time: the field manager stamps it on every write and the API
// server reverts it when nothing else changed
// (fieldmanager.IgnoreManagedFieldsTimestampsTransformer), while a change
// of the fields an entry owns is a write. A value of another shape is
// skipped and leaves sc not ok.
func parseManagedFields(d []byte, i int, sc *nodeScan) (int, error) {
	end, err := jsonscan.EachElement(d, i, "metadata.managedFields", func(vs int) (int, error) {
		sc.keep('F', nil, nil) // entry boundary
		return jsonscan.EachMember(d, vs, "metadata.managedFields[]", func(k []byte, vs int) (int, error) {
			e, err := jsonscan.SkipValue(d, vs)
			if err == nil && string(k) != "time" {
				sc.keep('f', k, d[vs:e])
			}
			return e, err
		})
	})
	if _, ok := err.(*jsonscan.TypeError); ok {
		sc.ok = false
		return jsonscan.SkipValue(d, i)
	}
	return end, err
}

// parseConditions records status.conditions in sc. A value of another
// shape is skipped and leaves sc not ok: nothing is held for it.
func parseConditions(d []byte, i int, sc *nodeScan) (int, error) {
	sc.conds = make([]condScan, 0, 6)
	end, err := jsonscan.EachElement(d, i, "status.conditions", func(vs int) (int, error) {
		c := condScan{rest: make([]member, 0, 5)}
		e, err := jsonscan.EachMember(d, vs, "status.conditions[]", func(k []byte, vs int) (int, error) {
			e, err := jsonscan.SkipValue(d, vs)
			if err != nil {
				return e, err
			}
			if string(k) == "lastHeartbeatTime" {
				c.heartbeat = d[vs:e]
			} else {
				c.rest = append(c.rest, member{key: k, val: d[vs:e]})
			}
			return e, nil
		})
		if err == nil {
			sc.conds = append(sc.conds, c)
		}
		return e, err
	})
	if _, ok := err.(*jsonscan.TypeError); ok {
		sc.ok = false
		return jsonscan.SkipValue(d, i)
	}
	return end, err
}
