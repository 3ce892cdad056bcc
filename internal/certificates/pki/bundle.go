package pki

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"slices"
	"time"
)

// defaultMaxBundleCerts caps a caBundle. A rotation needs at most three
// entries (next, active, one retired); the slack absorbs adopted CAs.
const defaultMaxBundleCerts = 8

// BundleOptions configure tidyBundle/BuildBundle.
type BundleOptions struct {
	// Now drops certificates whose NotAfter is not after Now; zero keeps all.
	Now time.Time
	// Max keeps at most Max certificates (the newest); 0 means
	// defaultMaxBundleCerts, negative means no cap.
	Max int
	// CAOnly drops certificates that are not CAs (a leaf in caBundle is noise).
	CAOnly bool
}

// tidyBundle dedupes certs (by DER), drops expired ones, orders newest first
// (NotBefore descending, then NotAfter descending, then DER for a total
// order) and caps the count. The input slice is not modified.
func tidyBundle(certs []*x509.Certificate, o BundleOptions) []*x509.Certificate {
	seen := map[[sha256.Size]byte]bool{}
	var out []*x509.Certificate
	for _, c := range certs {
		if c == nil {
			continue
		}
		if o.CAOnly && !c.IsCA {
			continue
		}
		if !o.Now.IsZero() && !o.Now.Before(c.NotAfter) {
			continue
		}
		fp := sha256.Sum256(c.Raw)
		if seen[fp] {
			continue
		}
		seen[fp] = true
		out = append(out, c)
	}
	slices.SortStableFunc(out, func(a, b *x509.Certificate) int {
		if c := b.NotBefore.Compare(a.NotBefore); c != 0 {
			return c
		}
		if c := b.NotAfter.Compare(a.NotAfter); c != 0 {
			return c
		}
		return bytes.Compare(a.Raw, b.Raw)
	})
	limit := o.Max
	if limit == 0 {
		limit = defaultMaxBundleCerts
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// BuildBundle is tidyBundle followed by PEM encoding: the bytes to put in a
// webhook configuration's caBundle. An empty result is nil.
func BuildBundle(certs []*x509.Certificate, o BundleOptions) []byte {
	return EncodeCertsPEM(tidyBundle(certs, o))
}

// MergeBundlesPEM parses and concatenates several PEM bundles, skipping any
// that do not parse, and tidies the result. It returns the bundle and the
// parse errors by input index (nil when all parsed). Use it to combine CA
// files read from a directory.
func MergeBundlesPEM(bundles [][]byte, o BundleOptions) ([]byte, map[int]error) {
	var all []*x509.Certificate
	var errs map[int]error
	for i, b := range bundles {
		certs, err := ParseCertsPEM(b)
		if err != nil {
			if errs == nil {
				errs = map[int]error{}
			}
			errs[i] = err
			continue
		}
		all = append(all, certs...)
	}
	return BuildBundle(all, o), errs
}

// BundleContains reports whether bundle (PEM) contains ca, byte for byte.
// An unparsable bundle contains nothing.
func BundleContains(bundle []byte, ca *x509.Certificate) bool {
	certs, err := ParseCertsPEM(bundle)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(certs, func(c *x509.Certificate) bool { return c.Equal(ca) })
}

// Fingerprint is the SHA-256 of a certificate's DER, usable as a map key.
func Fingerprint(c *x509.Certificate) [sha256.Size]byte { return sha256.Sum256(c.Raw) }

// VerifyServing checks that serving (a leaf) verifies for dnsName at now
// against the CAs in bundle (PEM), exactly as a TLS client given that
// caBundle would. It is the "would admission succeed" test.
func VerifyServing(serving *x509.Certificate, bundle []byte, dnsName string, now time.Time) error {
	pool := x509.NewCertPool()
	if len(bundle) > 0 {
		if certs, err := ParseCertsPEM(bundle); err == nil {
			for _, c := range certs {
				pool.AddCert(c)
			}
		}
	}
	_, err := serving.Verify(x509.VerifyOptions{
		Roots:       pool,
		DNSName:     dnsName,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err
}
