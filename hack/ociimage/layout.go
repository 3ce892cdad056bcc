package ociimage

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Annotations on each image's entry in a layout's index.json.
const (
	// annotationImageName is containerd's full image name
	// (images.AnnotationImageName); `ctr images import` names the image by
	// it, with no --base-name needed.
	annotationImageName = "io.containerd.image.name"
	// annotationRefName is the OCI image-spec's reference name: the tag.
	annotationRefName = "org.opencontainers.image.ref.name"
)

// WriteLayout writes imgs as an OCI image layout in dir, each index entry
// annotated with its normalized name and tag and its platform. dir is
// created, or replaced if it holds a layout already; any other non-empty
// directory is an error, never deleted.
func WriteLayout(dir string, imgs ...Named) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return fmt.Errorf("ociimage: layout %s: not empty and not an OCI layout, refusing to replace it", dir)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("ociimage: layout %s: %w", dir, err)
	}
	for _, n := range imgs {
		full, err := normalize(n.Name)
		if err != nil {
			return err
		}
		ref, err := name.ParseReference(full)
		if err != nil {
			return err
		}
		cf, err := n.Image.ConfigFile()
		if err != nil {
			return err
		}
		if err := p.AppendImage(n.Image,
			layout.WithAnnotations(map[string]string{annotationImageName: full, annotationRefName: ref.Identifier()}),
			layout.WithPlatform(v1.Platform{OS: cf.OS, Architecture: cf.Architecture})); err != nil {
			return fmt.Errorf("ociimage: layout %s: %s: %w", dir, n.Name, err)
		}
	}
	return nil
}

// WriteArchive writes imgs as an OCI archive (a tar of the layout) to
// path, for `ctr -n k8s.io images import <path>`.
func WriteArchive(path string, imgs ...Named) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".oci-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := WriteLayout(dir, imgs...); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := tarDir(f, dir); err != nil {
		f.Close()
		return fmt.Errorf("ociimage: archive %s: %w", path, err)
	}
	return f.Close()
}

// tarDir writes dir's tree (regular files and directories) to w.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime = 0, 0, "", "", epoch
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
