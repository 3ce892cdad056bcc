package podindex

import "hash/maphash"

// keyTable finds a pod's slot by namespace and name: an open-addressing
// table (linear probing) of slot numbers, 4 bytes an entry at most 3/4
// full, which reads each entry's key from the record in its slot. A Go
// map[podKey]int32 held the key again in every entry: 32 bytes an entry
// and about 12 MB at 150,000 pods (run S's heap profile, docs/scale.md);
// this table holds about 1 MB.
//
// The caller keeps the records in slots; get and remove read them, so a
// slot must hold its record while the table names it (remove before the
// slot is emptied), and a record's namespace and name never change.
type keyTable struct {
	// t holds slot+1 per entry: 0 is empty, tombstone a removed entry.
	t []int32
	// n counts live entries, used live entries and tombstones.
	n, used int
	seed    maphash.Seed
}

const tombstone = -1

func newKeyTable() keyTable { return keyTable{seed: maphash.MakeSeed()} }

func (kt *keyTable) hash(k podKey) uint64 { return maphash.Comparable(kt.seed, k) }

// get is the slot of k, if the table holds it.
func (kt *keyTable) get(k podKey, slots []*Pod) (int32, bool) {
	if kt.n == 0 {
		return 0, false
	}
	mask := uint64(len(kt.t) - 1)
	for i := kt.hash(k) & mask; ; i = (i + 1) & mask {
		switch e := kt.t[i]; {
		case e == 0:
			return 0, false
		case e > 0:
			if p := slots[e-1]; p.Namespace == k.ns && p.Name == k.name {
				return e - 1, true
			}
		}
	}
}

// put adds k at slot, which the table must not hold yet; slots must hold
// the records of every slot the table names already (a rehash reads
// them), not necessarily k's.
func (kt *keyTable) put(k podKey, slot int32, slots []*Pod) {
	if (kt.used+1)*4 > len(kt.t)*3 {
		kt.rehash(slots)
	}
	mask := uint64(len(kt.t) - 1)
	i := kt.hash(k) & mask
	for kt.t[i] > 0 {
		i = (i + 1) & mask
	}
	if kt.t[i] == 0 {
		kt.used++
	}
	kt.t[i] = slot + 1
	kt.n++
}

// remove drops k, which the table holds at slot.
func (kt *keyTable) remove(k podKey, slot int32) {
	mask := uint64(len(kt.t) - 1)
	for i := kt.hash(k) & mask; ; i = (i + 1) & mask {
		switch kt.t[i] {
		case 0:
			return
		case slot + 1:
			kt.t[i] = tombstone
			kt.n--
			return
		}
	}
}

// rehash rebuilds the table without tombstones, twice as large as its
// live entries need at the most full.
func (kt *keyTable) rehash(slots []*Pod) {
	size := 8
	for size*3 < (kt.n+1)*4*2 {
		size *= 2
	}
	old := kt.t
	kt.t, kt.n, kt.used = make([]int32, size), 0, 0
	mask := uint64(size - 1)
	for _, e := range old {
		if e <= 0 {
			continue
		}
		p := slots[e-1]
		i := kt.hash(podKey{p.Namespace, p.Name}) & mask
		for kt.t[i] != 0 {
			i = (i + 1) & mask
		}
		kt.t[i] = e
		kt.n++
		kt.used++
	}
}

// bytes is the table's own memory.
func (kt *keyTable) bytes() int { return 4 * len(kt.t) }
