// Package doclinks holds one test: every relative link in README.md,
// docs/*.md and test/README.md names a file that exists and, with a
// fragment, a heading of that file, anchored as GitHub renders it
// (lower case, punctuation dropped, spaces to hyphens, "-1" for a
// repeated heading). It has no code of its own and imports only the
// standard library.
package doclinks
