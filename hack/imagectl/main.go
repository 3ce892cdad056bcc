// Command imagectl builds this repository's images without a Docker engine
// (hack/ociimage) and serves them from a local registry:
//
//	imagectl build [flags] [SET...]     build the sets (operator, pause,
//	                                    standins; all by default), write an
//	                                    OCI layout and/or archive, push them
//	imagectl registry [flags] [SET...]  serve a registry on 127.0.0.1 with
//	                                    the sets pushed, write containerd's
//	                                    hosts config for it, run until
//	                                    SIGTERM or SIGINT
//
// `make image` and `make images` run the first; make demo can run the second.
//
// It must not import the operator's packages (controllers, webhooks): it
// only drives hack/ociimage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hookwright/hookwright/hack/ociimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "imagectl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: imagectl build|registry [flags] [SET...]")
	}
	fs := flag.NewFlagSet("imagectl "+args[0], flag.ContinueOnError)
	var o ociimage.Options
	fs.StringVar(&o.Root, "root", ".", "repository root")
	fs.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH of the images")
	fs.StringVar(&o.Version, "version", "v0.1.0", "operator version (hack/build.sh)")
	fs.StringVar(&o.GitCommit, "commit", "unknown", "operator git commit (hack/build.sh)")
	fs.StringVar(&o.OperatorName, "name", ociimage.OperatorName, "the operator image's name (the Makefile's IMG)")
	fs.StringVar(&o.CACertificates, "ca-certificates", ociimage.DefaultCACertificates, "CA bundle for the operator image")
	fs.StringVar(&o.BundleName, "bundle-name", ociimage.BundleName, "the bundle image's name (olm set)")
	fs.StringVar(&o.Busybox, "busybox", ociimage.DefaultBusybox, "static busybox (olm set; Debian busybox-static)")
	fs.StringVar(&o.OPM, "opm", "", "static opm (olm set; default ROOT/bin/opm)")
	binDir := fs.String("bin-dir", "", "where binaries are built (a temporary directory if empty)")
	layoutDir := fs.String("layout", "", "write an OCI image layout to this directory")
	archive := fs.String("archive", "", "write an OCI archive (for ctr images import) to this file")
	push := fs.String("push", "", "push to the registry at this host[:port] (off this machine: HTTPS, verified unless IMAGE_REGISTRY_INSECURE=true)")
	listen := fs.String("listen", "127.0.0.1:0", "registry: listen address (loopback only)")
	hostsDir := fs.String("hosts-dir", "", "registry: write containerd's registry hosts config (certs.d) here")
	addrFile := fs.String("addr-file", "", "registry: write the registry's address to this file once it serves")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *binDir == "" {
		d, err := os.MkdirTemp("", "imagectl-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*binDir = d
	}
	o.BinDir = *binDir

	switch args[0] {
	case "build":
		if *layoutDir == "" && *archive == "" && *push == "" {
			return errors.New("build: give --layout, --archive or --push")
		}
		imgs, err := build(ctx, o, fs.Args())
		if err != nil {
			return err
		}
		return output(ctx, imgs, *layoutDir, *archive, *push)
	case "registry":
		imgs, err := build(ctx, o, fs.Args())
		if err != nil {
			return err
		}
		r, err := ociimage.StartRegistry(*listen, nil)
		if err != nil {
			return err
		}
		defer r.Close()
		if err := output(ctx, imgs, *layoutDir, *archive, r.Addr); err != nil {
			return err
		}
		if *hostsDir != "" {
			if err := ociimage.WriteContainerdHosts(*hostsDir, r.Addr, ociimage.MirroredRegistries); err != nil {
				return err
			}
			fmt.Printf("containerd hosts config for %s in %s\n", r.Addr, *hostsDir)
		}
		if *addrFile != "" {
			if err := os.WriteFile(*addrFile, []byte(r.Addr+"\n"), 0o644); err != nil {
				return err
			}
		}
		fmt.Printf("registry serving on %s\n", r.Addr)
		<-ctx.Done()
		return nil
	default:
		return fmt.Errorf("unknown command %q (want build or registry)", args[0])
	}
}

func build(ctx context.Context, o ociimage.Options, sets []string) ([]ociimage.Named, error) {
	start := time.Now()
	imgs, err := ociimage.Build(ctx, o, sets...)
	if err != nil {
		return nil, err
	}
	fmt.Printf("built %d images in %s\n", len(imgs), time.Since(start).Round(10*time.Millisecond))
	return imgs, nil
}

// output writes the layout and archive and pushes, then lists the images
// with their digests and sizes.
func output(ctx context.Context, imgs []ociimage.Named, layoutDir, archive, push string) error {
	start := time.Now()
	if layoutDir != "" {
		if err := ociimage.WriteLayout(layoutDir, imgs...); err != nil {
			return err
		}
		fmt.Printf("OCI layout: %s\n", layoutDir)
	}
	if archive != "" {
		if err := ociimage.WriteArchive(archive, imgs...); err != nil {
			return err
		}
		fmt.Printf("OCI archive: %s (ctr -n k8s.io images import --local --snapshotter native %s)\n", archive, archive)
	}
	if push != "" {
		// A registry off this machine is verified (HTTPS only) unless
		// IMAGE_REGISTRY_INSECURE=true, as make bundle-image does.
		if err := ociimage.PushTo(ctx, push, os.Getenv("IMAGE_REGISTRY_INSECURE") == "true", imgs...); err != nil {
			return err
		}
		fmt.Printf("pushed to %s\n", push)
	}
	fmt.Printf("written in %s\n", time.Since(start).Round(10*time.Millisecond))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tDIGEST\tCOMPRESSED\tUNCOMPRESSED")
	for _, n := range imgs {
		s, err := ociimage.Sizes(n.Image)
		if err != nil {
			return err
		}
		d, err := n.Image.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.Name, d.String()[:19], mib(s.Compressed), mib(s.Uncompressed))
	}
	return tw.Flush()
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
