// Command chartgen writes the Helm chart dist/chart from config/ (`make
// chart`); see internal/helmchart. Run it from the repository root.
package main

import (
	"fmt"
	"os"

	"github.com/hookwright/hookwright/internal/helmchart"
)

func main() {
	if err := helmchart.Write("."); err != nil {
		fmt.Fprintln(os.Stderr, "chartgen:", err)
		os.Exit(1)
	}
	fmt.Println("chartgen: wrote", helmchart.Dir)
}
