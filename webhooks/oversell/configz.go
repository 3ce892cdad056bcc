package oversell

import (
	"encoding/json"
	"net/http"
)

// Configz is the JSON document served at /configz: what this server
// replica applies, so the operator can report status.servedGeneration.
type Configz struct {
	Synced           bool            `json:"synced"`
	Hash             string          `json:"hash"`
	NodeOversells    []ConfigzPolicy `json:"nodeOversells"`
	Ignored          []Ignored       `json:"ignored"`
	Deleting         []string        `json:"deleting"`
	TrustedReporters []string        `json:"trustedReporters"`
}

// ConfigzPolicy is one served NodeOversell, in precedence order.
type ConfigzPolicy struct {
	Name       string            `json:"name"`
	Generation int64             `json:"generation"`
	Priority   int32             `json:"priority"`
	Selector   string            `json:"selector"`
	Ratios     map[string]string `json:"ratios"`
}

// newConfigz renders a snapshot.
func newConfigz(s *Snapshot) Configz {
	c := Configz{
		Synced:           s.Synced,
		Hash:             s.Hash,
		NodeOversells:    []ConfigzPolicy{},
		Ignored:          s.Ignored,
		Deleting:         s.Deleting,
		TrustedReporters: s.ExtraTrusted,
	}
	if c.Ignored == nil {
		c.Ignored = []Ignored{}
	}
	if c.Deleting == nil {
		c.Deleting = []string{}
	}
	if c.TrustedReporters == nil {
		c.TrustedReporters = []string{}
	}
	for _, p := range s.Policies {
		cp := ConfigzPolicy{Name: p.Name, Generation: p.Generation, Priority: p.Priority, Selector: p.Selector.String(), Ratios: map[string]string{}}
		for r := Resource(0); r < numResources; r++ {
			if p.Ratios[r].IsSet() {
				cp.Ratios[resourceNames[r]] = p.Ratios[r].String()
			}
		}
		c.NodeOversells = append(c.NodeOversells, cp)
	}
	return c
}

// ConfigzHandler serves GET /configz with the current snapshot of src.
func ConfigzHandler(src SnapshotSource) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "method not allowed; GET /configz", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(newConfigz(src.snapshot()))
	})
}
