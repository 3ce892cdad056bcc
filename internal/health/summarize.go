package health

import (
	"fmt"
	"strings"
)

// Summarize joins the first n of items with ", " and counts the rest
// ("a, b and 3 more"), for a condition message that must stay short.
func Summarize(paths []string, n int) string {
	if len(paths) <= n {
		return strings.Join(paths, ", ")
	}
	return strings.Join(paths[:n], ", ") + fmt.Sprintf(" and %d more", len(paths)-n)
}
