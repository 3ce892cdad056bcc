// Command olm-crds writes OLM's CustomResourceDefinitions, as embedded in
// github.com/operator-framework/api/crds at the version this module pins (the
// one OLM v0.33.0 requires), as YAML files into a directory.
//
//	olm-crds <dir>
package main

import (
	"fmt"
	"os"

	"github.com/operator-framework/api/crds"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: olm-crds <dir>")
		os.Exit(2)
	}
	if err := os.MkdirAll(os.Args[1], 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "olm-crds:", err)
		os.Exit(1)
	}
	for _, name := range crds.AssetNames() {
		if err := crds.RestoreAsset(os.Args[1], name); err != nil {
			fmt.Fprintln(os.Stderr, "olm-crds:", err)
			os.Exit(1)
		}
	}
}
