package ociimage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// The image sets Build knows.
const (
	SetOperator = "operator" // OperatorName
	SetPause    = "pause"    // PauseName
	SetStandins = "standins" // nginxName, proxyName, proxyNextName, proxyInitName, logShipperName, StandinName
	SetOLM      = "olm"      // BundleName, opmName, IndexName, olmUtilName, decompressionName
)

// Sets lists every set, in build order.
var imageSets = []string{SetOperator, SetPause, SetStandins, SetOLM}

// defaultSets are what Build builds when given none: everything but the
// olm set, which needs a static busybox and bin/opm.
var defaultSets = []string{SetOperator, SetPause, SetStandins}

// Options say what Build builds from.
type Options struct {
	// Root is the repository root (go.mod, hack/build.sh). Required.
	Root string
	// BinDir receives the compiled binaries. Required.
	BinDir string
	// Arch is the images' GOARCH; runtime.GOARCH when empty.
	Arch string
	// Version and GitCommit are stamped into the operator binary
	// (hack/build.sh's arguments); v0.1.0 and "unknown" when empty.
	Version, GitCommit string
	// OperatorName overrides OperatorName (the Makefile's IMG).
	OperatorName string
	// CACertificates overrides DefaultCACertificates.
	CACertificates string
	// BundleName overrides BundleName, e.g. with the local registry's
	// address for `operator-sdk run bundle`.
	BundleName string
	// BundleDir is the bundle directory of the olm set's bundle image;
	// Root/bundle when empty.
	BundleDir string
	// Busybox overrides DefaultBusybox (a static busybox for the olm set).
	Busybox string
	// OPM is the static opm binary for the olm set; Root/bin/opm (built
	// by hack/tools.sh) when empty.
	OPM string
}

func (o Options) withDefaults() (Options, error) {
	if o.Root == "" || o.BinDir == "" {
		return o, fmt.Errorf("ociimage: Options.Root and Options.BinDir are required")
	}
	var err error
	if o.Root, err = filepath.Abs(o.Root); err != nil {
		return o, err
	}
	if o.BinDir, err = filepath.Abs(o.BinDir); err != nil {
		return o, err
	}
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	if o.Version == "" {
		o.Version = "v0.1.0"
	}
	if o.GitCommit == "" {
		o.GitCommit = "unknown"
	}
	if o.OperatorName == "" {
		o.OperatorName = OperatorName
	}
	if o.CACertificates == "" {
		o.CACertificates = DefaultCACertificates
	}
	if o.BundleName == "" {
		o.BundleName = BundleName
	}
	if o.Busybox == "" {
		o.Busybox = DefaultBusybox
	}
	if o.BundleDir == "" {
		o.BundleDir = filepath.Join(o.Root, "bundle")
	}
	if o.OPM == "" {
		o.OPM = filepath.Join(o.Root, "bin", "opm")
	}
	return o, nil
}

// Build compiles what the given sets need (defaultSets when none is given)
// and returns their images in set order. Binaries are static linux/Arch
// builds (CGO_ENABLED=0); the operator's comes from hack/build.sh, the one
// build command the Dockerfile runs too.
func Build(ctx context.Context, o Options, sets ...string) ([]Named, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(sets) == 0 {
		sets = defaultSets
	}
	for _, s := range sets {
		if !slices.Contains(imageSets, s) {
			return nil, fmt.Errorf("ociimage: unknown image set %q (want one of %s)", s, strings.Join(imageSets, ", "))
		}
	}
	if err := os.MkdirAll(o.BinDir, 0o755); err != nil {
		return nil, err
	}
	var out []Named
	for _, s := range imageSets {
		if !slices.Contains(sets, s) {
			continue
		}
		switch s {
		case SetOperator:
			bin := filepath.Join(o.BinDir, "hookwright-linux-"+o.Arch)
			if err := OperatorBinary(ctx, o.Root, o.Arch, o.Version, o.GitCommit, bin); err != nil {
				return nil, err
			}
			img, err := operator(o.Arch, bin, o.CACertificates)
			if err != nil {
				return nil, err
			}
			out = append(out, Named{Name: o.OperatorName, Image: img})
		case SetPause:
			bin, err := goBuild(ctx, o.Root, "./test/images/pause", o.BinDir, o.Arch)
			if err != nil {
				return nil, err
			}
			img, err := pause(o.Arch, bin)
			if err != nil {
				return nil, err
			}
			out = append(out, Named{Name: PauseName, Image: img})
		case SetStandins:
			bin, err := goBuild(ctx, o.Root, "./test/images/standin", o.BinDir, o.Arch)
			if err != nil {
				return nil, err
			}
			imgs, err := standinImages(o.Arch, bin)
			if err != nil {
				return nil, err
			}
			out = append(out, imgs...)
		case SetOLM:
			imgs, err := buildOLM(ctx, o)
			if err != nil {
				return nil, err
			}
			out = append(out, imgs...)
		}
	}
	return out, nil
}

// buildOLM builds the olm set. cpb comes from OLM's module at the version
// hack/tools/olm pins, the OLM the tests run.
func buildOLM(ctx context.Context, o Options) ([]Named, error) {
	bundle, err := Bundle(o.Arch, o.BundleDir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(o.OPM); err != nil {
		return nil, fmt.Errorf("ociimage: opm for the opm image: %w (run make tools)", err)
	}
	opm, err := opmImage(o.Arch, o.OPM, o.Busybox)
	if err != nil {
		return nil, err
	}
	index, err := index(o.Arch, o.OPM, o.Busybox)
	if err != nil {
		return nil, err
	}
	cpb := filepath.Join(o.BinDir, "cpb-linux-"+o.Arch)
	if err := run(ctx, filepath.Join(o.Root, "hack", "tools", "olm"), []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + o.Arch},
		"go", "build", "-trimpath", "-ldflags=-s -w", "-o", cpb, "github.com/operator-framework/operator-lifecycle-manager/util/cpb"); err != nil {
		return nil, err
	}
	util, err := olmUtil(o.Arch, cpb, o.Busybox)
	if err != nil {
		return nil, err
	}
	dec, err := decompression(o.Arch, o.Busybox)
	if err != nil {
		return nil, err
	}
	return []Named{
		{Name: o.BundleName, Image: bundle},
		{Name: opmName, Image: opm},
		{Name: IndexName, Image: index},
		{Name: olmUtilName, Image: util},
		{Name: decompressionName, Image: dec},
	}, nil
}

// goBuild compiles the main package pkg (relative to root, "./hack/...")
// into binDir as a static, stripped linux/arch binary named after the
// package, and returns its path.
func goBuild(ctx context.Context, root, pkg, binDir, arch string) (string, error) {
	out := filepath.Join(binDir, filepath.Base(pkg)+"-linux-"+arch)
	err := run(ctx, root, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + arch},
		"go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	return out, err
}

func run(ctx context.Context, dir string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ociimage: %s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
