package podindex

import (
	"runtime"
	"sync"
	"weak"

	"k8s.io/apimachinery/pkg/types"
)

// oddIDs holds a UID or resourceVersion that does not pack (fake
// clients' pods, an aggregated API's pods): rare, so not a field of every
// record but an entry of oddOf, keyed weakly by its record and dropped by
// a cleanup when the record is collected, indexed or not.
type oddIDs struct {
	uid types.UID
	rv  string
}

var (
	oddMu sync.Mutex
	oddOf = map[weak.Pointer[Pod]]*oddIDs{}
)

// oddOverhead is what a side record costs besides its strings, for the
// size estimate: the oddIDs, its map entry, the weak handle and the
// cleanup's closure (about 96 heap bytes, measured at 100,000 records)
// and the runtime's two specials for them (56 bytes, off the heap).
const oddOverhead = 152

// setOdd attaches o to p until p is collected.
func (p *Pod) setOdd(o *oddIDs) {
	w := weak.Make(p)
	oddMu.Lock()
	oddOf[w] = o
	oddMu.Unlock()
	p.odd = true
	runtime.AddCleanup(p, func(w weak.Pointer[Pod]) {
		oddMu.Lock()
		delete(oddOf, w)
		oddMu.Unlock()
	}, w)
}

// ids is p's side record, nil when its IDs packed.
func (p *Pod) ids() *oddIDs {
	if !p.odd {
		return nil
	}
	w := weak.Make(p)
	oddMu.Lock()
	defer oddMu.Unlock()
	return oddOf[w]
}
