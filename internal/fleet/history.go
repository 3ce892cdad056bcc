package fleet

import (
	"cmp"
	"slices"
)

// HistoryLimit is how many revisions of a SidecarInjector are kept.
const HistoryLimit = 10

// Kept is one kept revision (a ControllerRevision).
type Kept struct {
	// Name of the ControllerRevision, Hash the revision it records.
	Name, Hash string
	// Number is its .revision: higher is newer.
	Number int64
}

// HistoryPlan is what to do to a CR's revision history.
type HistoryPlan struct {
	// Create, when non-zero, is the number of a new revision of the
	// current hash to create.
	Create int64
	// Renumber is a kept revision of the current hash that is not the
	// newest (the spec went back to it): it becomes number RenumberTo,
	// as a Deployment renumbers a ReplicaSet it rolls back to.
	Renumber   *Kept
	RenumberTo int64
	// Delete are the oldest revisions beyond limit, and repeats of a hash.
	Delete []Kept
}

// PlanHistory plans kept revisions so that the current hash is the newest
// and at most limit remain, besides protect (a pinned revision), which is
// never deleted.
func PlanHistory(kept []Kept, hash, protect string, limit int) HistoryPlan {
	ks := slices.Clone(kept)
	slices.SortFunc(ks, func(a, b Kept) int { return cmp.Or(cmp.Compare(b.Number, a.Number), cmp.Compare(a.Name, b.Name)) })
	var p HistoryPlan
	var max int64
	if len(ks) > 0 {
		max = ks[0].Number
	}
	// Newest first, one per hash; the current one at the front.
	var keep []Kept
	seen := map[string]bool{}
	var cur *Kept
	for i := range ks {
		k := ks[i]
		if seen[k.Hash] {
			p.Delete = append(p.Delete, k)
			continue
		}
		seen[k.Hash] = true
		if k.Hash == hash {
			cur = &ks[i]
			continue
		}
		if k.Hash == protect {
			continue
		}
		keep = append(keep, k)
	}
	switch {
	case cur == nil:
		p.Create = max + 1
	case cur.Number != max:
		p.Renumber, p.RenumberTo = cur, max+1
	}
	// The current one counts against the limit.
	if room := limit - 1; room >= 0 && len(keep) > room {
		p.Delete = append(p.Delete, keep[room:]...)
	}
	return p
}
