package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"

	"github.com/hookwright/hookwright/hack/ociimage"
	"github.com/hookwright/hookwright/hack/olmbundle"
)

// image is make bundle-image: the operator image and the olm set (the
// bundle, opm, the empty index, OLM's util image, the decompression image)
// built and pushed to the registry.
func (a *app) image(ctx context.Context) error {
	n, err := a.s.names()
	if err != nil {
		return err
	}
	start := time.Now()
	tmp, err := os.MkdirTemp("", "hookwright-bundle-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bundleDir, note, err := a.bundleDir(tmp)
	if err != nil {
		return err
	}
	fmt.Printf("runbundle: building the operator image %s and the bundle image %s (%s) ...\n", a.s.Operator, a.s.Bundle, note)
	imgs, err := ociimage.Build(ctx, ociimage.Options{
		Root: a.root, BinDir: filepath.Join(tmp, "bin"), Version: "v" + a.s.Version, GitCommit: a.commit,
		OperatorName: a.s.Operator, BundleName: a.s.Bundle, BundleDir: bundleDir,
	}, ociimage.SetOperator, ociimage.SetOLM)
	if err != nil {
		return err
	}
	built := time.Since(start)
	if err := ociimage.PushTo(ctx, a.s.Registry, a.s.Insecure, imgs...); err != nil {
		return registryError(a.s.Registry, err)
	}
	fmt.Printf("runbundle: %d images built in %s, pushed to %s in %s:\n", len(imgs), built.Round(100*time.Millisecond),
		a.s.Registry, (time.Since(start) - built).Round(100*time.Millisecond))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	for _, img := range imgs {
		ref, err := ociimage.LocalReference(a.s.Registry, img.Name)
		if err != nil {
			return err
		}
		d, err := img.Image.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "  %s\t%s\n", ref, d.String()[:19])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	target, flag := "run", ""
	if v, _, err := bundleVersion(filepath.Join(a.root, "bundle")); err == nil && v != a.s.Version {
		target, flag = "upgrade", " VERSION="+a.s.Version
	}
	fmt.Printf("runbundle: for operator-sdk: bundle %s, --index-image %s; make %s%s runs:\n  %s\n",
		n.Bundle, n.Index, map[string]string{"run": "run-bundle", "upgrade": "run-bundle-upgrade"}[target], flag,
		a.s.commandLine("bin/operator-sdk", a.s.sdkArgs(target, n)))
	return nil
}

// bundleDir returns the bundle directory to build: bundle/ itself when
// VERSION and IMG are what it names, else a derived copy in tmp (a next
// version that replaces it, and/or naming IMG), and says which.
func (a *app) bundleDir(tmp string) (dir, note string, err error) {
	src := filepath.Join(a.root, "bundle")
	version, image, err := bundleVersion(src)
	if err != nil {
		return "", "", err
	}
	if version == a.s.Version && image == a.s.Operator {
		return src, "bundle/ as committed", nil
	}
	dst := filepath.Join(tmp, "bundle")
	r, err := olmbundle.Derive(src, dst, olmbundle.Options{Version: a.s.Version, Image: a.s.Operator})
	if err != nil {
		return "", "", err
	}
	var what []string
	if r.NewName != r.OldName {
		what = append(what, fmt.Sprintf("%s replacing %s", r.NewName, r.OldName))
	}
	if a.s.Operator != r.OldImage {
		what = append(what, "naming "+a.s.Operator+" instead of "+r.OldImage)
	}
	return dst, "bundle/ derived in a temporary directory: " + strings.Join(what, ", ") + "; tracked files untouched", nil
}

// bundleVersion reads the version and operator image of the CSV in dir.
func bundleVersion(dir string) (version, image string, err error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifests", Package+".clusterserviceversion.yaml"))
	if err != nil {
		return "", "", err
	}
	var csv struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Version string `json:"version"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &csv); err != nil {
		return "", "", err
	}
	return csv.Spec.Version, csv.Metadata.Annotations["containerImage"], nil
}

// checkImages checks the registry answers over HTTPS, as operator-sdk
// reads it (its certificate verified unless Insecure), and serves refs.
func checkImages(ctx context.Context, s Settings, refs ...string) error {
	roots, err := ociimage.RootsFromEnvFile(s.SSLCertFile)
	if err != nil {
		return err
	}
	tr := ociimage.HTTPSTransport(s.Registry, roots, s.Insecure)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+s.Registry+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		return registryError(s.Registry, err)
	}
	resp.Body.Close()
	for _, r := range refs {
		ref, err := name.ParseReference(r)
		if err != nil {
			return err
		}
		if _, err := remote.Head(ref, remote.WithContext(ctx), remote.WithTransport(tr)); err != nil {
			return registryError(s.Registry, fmt.Errorf("image %s: %w", r, err))
		}
	}
	return nil
}
