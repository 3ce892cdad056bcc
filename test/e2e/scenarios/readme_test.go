package scenarios

import (
	"slices"
	"testing"
)

// The block READMEOLM runs is found where the README's install page keeps
// it, and is the six commands scenario 7 checks against (no cluster: it
// only reads the page).
func TestREADMEBlock(t *testing.T) {
	got, err := READMEBlock()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"make cleanup-bundle",
		"make bundle-image",
		"make run-bundle",
		"make bundle-image VERSION=0.1.1",
		"make run-bundle-upgrade VERSION=0.1.1",
		"make cleanup-bundle",
	}
	if !slices.Equal(got, want) {
		t.Errorf("READMEBlock() = %q, want %q", got, want)
	}
}
