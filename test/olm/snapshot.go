package olm

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// ObjectKey names one object of the cluster: its API group and resource
// (not the version: one object served in two versions is one object), its
// namespace ("" for cluster-scoped) and name.
type ObjectKey struct {
	Group, Resource, Namespace, Name string
}

func (k ObjectKey) String() string {
	gr := schema.GroupResource{Group: k.Group, Resource: k.Resource}.String()
	if k.Namespace == "" {
		return gr + " " + k.Name
	}
	return gr + " " + k.Namespace + "/" + k.Name
}

// Snapshot lists every object of every resource the cluster serves that
// can be listed (discovery's preferred versions, metadata only): its key
// and a description (labels, owner references, creation time) for
// messages.
// Use it before and after an install and uninstall: what NewObjects finds
// between the two is what the uninstall left.
func Snapshot(ctx context.Context, cfg *rest.Config) (map[ObjectKey]ObjectInfo, error) {
	// Listing every kind hits deprecated ones (v1 Endpoints,
	// ComponentStatus): their warnings say nothing here.
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rest.NoWarnings{}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	lists, err := dc.ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	// A group that failed discovery (an aggregated API that is down) is
	// left out; everything served here is built in or a CRD.
	out := map[ObjectKey]ObjectInfo{}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			return nil, err
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !hasVerb(r, "list") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			var items []metav1.PartialObjectMetadata
			opts := metav1.ListOptions{}
			for {
				list, err := mc.Resource(gvr).List(ctx, opts)
				if err != nil {
					return nil, fmt.Errorf("list %s: %w", gvr, err)
				}
				items = append(items, list.Items...)
				if list.Continue == "" {
					break
				}
				opts.Continue = list.Continue
			}
			for _, it := range items {
				out[ObjectKey{Group: gv.Group, Resource: r.Name, Namespace: it.Namespace, Name: it.Name}] = describe(&it)
			}
		}
	}
	return out, nil
}

func hasVerb(r metav1.APIResource, verb string) bool {
	for _, v := range r.Verbs {
		if v == verb {
			return true
		}
	}
	return false
}

// Transient are the resources NewObjects never reports: records that
// expire on their own (Events, the API server's one-hour --event-ttl).
var Transient = map[schema.GroupResource]bool{
	{Group: "", Resource: "events"}:              true,
	{Group: "events.k8s.io", Resource: "events"}: true,
}

// ObjectInfo is what Snapshot keeps of an object's metadata.
type ObjectInfo struct {
	Labels map[string]string
	// Owners are the owner references as Kind/name.
	Owners  []string
	Created time.Time
}

func (i ObjectInfo) String() string {
	return fmt.Sprintf("labels %v owners %v created %s", i.Labels, i.Owners, i.Created.UTC().Format(time.RFC3339))
}

func describe(m *metav1.PartialObjectMetadata) ObjectInfo {
	info := ObjectInfo{Labels: m.Labels, Created: m.CreationTimestamp.Time}
	for _, o := range m.OwnerReferences {
		info.Owners = append(info.Owners, o.Kind+"/"+o.Name)
	}
	return info
}

// Labelled returns the keys of objs whose labels have key, sorted.
func Labelled(objs map[ObjectKey]ObjectInfo, key string) []ObjectKey {
	var out []ObjectKey
	for k, info := range objs {
		if _, ok := info.Labels[key]; ok {
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// NewObjects returns the keys of after that are not in before, except
// Transient resources, sorted.
func NewObjects[V any](before, after map[ObjectKey]V) []ObjectKey {
	var out []ObjectKey
	for k := range after {
		if _, ok := before[k]; ok || Transient[schema.GroupResource{Group: k.Group, Resource: k.Resource}] {
			continue
		}
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
