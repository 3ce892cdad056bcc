//go:build !unix

package ociimage

import "errors"

// lockFile is unavailable here: OperatorBinary then builds without the
// cache.
func lockFile(string) (func(), error) {
	return nil, errors.New("ociimage: no file locks on this platform")
}
