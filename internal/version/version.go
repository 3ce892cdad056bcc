// Package version holds build information stamped in with -ldflags -X.
//
// It imports nothing.
package version

import (
	"fmt"
	"runtime"
)

// Set at build time: -X github.com/hookwright/hookwright/internal/version.Version=v0.1.0
var (
	Version   = "v0.0.0-dev"
	GitCommit = "unknown"
	BuildDate = "unknown"
)

// String is the one-line version shown by `hookwright version`.
func String() string {
	return fmt.Sprintf("hookwright %s (commit %s, built %s, %s %s/%s)",
		Version, GitCommit, BuildDate, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
