package image

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerName = "io.containerd.image.name"
)

// openArchive opens the image of a `docker save` tarball that selector picks.
func openArchive(path, selector string) (v1.Image, Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, Image{}, err
	}
	if len(m) == 0 {
		return nil, Image{}, errors.New("manifest.json lists no images")
	}
	i, tag, err := pick(len(m), func(i int) []string { return m[i].RepoTags }, selector)
	if err != nil {
		return nil, Image{}, err
	}
	var t *name.Tag
	if tag == "" && len(m[i].RepoTags) > 0 {
		tag = m[i].RepoTags[0]
	}
	if tag != "" {
		nt, err := name.NewTag(tag)
		if err != nil {
			return nil, Image{}, fmt.Errorf("bad tag %q: %w", tag, err)
		}
		t = &nt
	}
	img, err := tarball.Image(opener, t)
	if err != nil {
		return nil, Image{}, err
	}
	// The config digest is docker's image ID. A manifest digest would mean compressing
	// every layer, since a docker archive has no manifest of its own.
	cfg, err := img.ConfigName()
	if err != nil {
		return nil, Image{}, err
	}
	n := fileImageName(path)
	if tag != "" {
		n = canonical(tag)
	}
	return img, Image{Name: n, Digest: cfg.String(), Source: SourceDockerArchive}, nil
}

// openLayout opens the image of an OCI image layout that selector picks.
func openLayout(dir, selector string) (v1.Image, Image, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, Image{}, err
	}
	ii, err := lp.ImageIndex()
	if err != nil {
		return nil, Image{}, err
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, Image{}, err
	}
	var descs []v1.Descriptor
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() || d.MediaType.IsIndex() {
			descs = append(descs, d)
		}
	}
	if len(descs) == 0 {
		return nil, Image{}, errors.New("index.json lists no images")
	}
	refNames := func(i int) []string {
		var out []string
		for _, k := range []string{annotationContainerName, annotationRefName} {
			if v := descs[i].Annotations[k]; v != "" {
				out = append(out, v)
			}
		}
		return out
	}
	i, _, err := pick(len(descs), refNames, selector)
	if err != nil {
		return nil, Image{}, err
	}
	d := descs[i]
	var img v1.Image
	if d.MediaType.IsIndex() {
		child, err := ii.ImageIndex(d.Digest)
		if err != nil {
			return nil, Image{}, err
		}
		img, d.Digest, err = pickPlatform(child)
		if err != nil {
			return nil, Image{}, err
		}
	} else if img, err = ii.Image(d.Digest); err != nil {
		return nil, Image{}, err
	}

	n := fileImageName(dir)
	if full := descs[i].Annotations[annotationContainerName]; full != "" {
		n = canonical(full)
	} else if rn := descs[i].Annotations[annotationRefName]; strings.ContainsAny(rn, ":/") {
		n = canonical(rn) // a full reference
	} else if rn != "" {
		n += ":" + rn // just a tag, as skopeo and umoci write it
	}
	return img, Image{Name: n, Digest: d.Digest.String(), Source: SourceOCILayout}, nil
}

// pickPlatform picks this machine's image from a multi-platform index.
func pickPlatform(idx v1.ImageIndex) (v1.Image, v1.Hash, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, err
	}
	var have []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			continue
		}
		if m.Platform.OS == "linux" && m.Platform.Architecture == runtime.GOARCH {
			img, err := idx.Image(m.Digest)
			return img, m.Digest, err
		}
		have = append(have, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	return nil, v1.Hash{}, fmt.Errorf("no linux/%s image in the index (it has: %s)", runtime.GOARCH, listNames(have))
}

// pick chooses one of n images by selector, matched against each image's names in
// full, as a normalized reference, or by tag alone ("v1" matches "repo:v1").
// It returns the index and the name that matched (or the only image and "").
func pick(n int, namesOf func(int) []string, selector string) (int, string, error) {
	describe := func() string {
		var all []string
		for i := 0; i < n; i++ {
			if ns := namesOf(i); len(ns) > 0 {
				all = append(all, strings.Join(ns, " = "))
			} else {
				all = append(all, fmt.Sprintf("<untagged #%d>", i+1))
			}
		}
		return listNames(all)
	}
	if selector == "" {
		if n == 1 {
			return 0, "", nil
		}
		return 0, "", fmt.Errorf("it holds %d images (%s); pick one with PATH:TAG", n, describe())
	}
	found, tag := -1, ""
	for i := 0; i < n; i++ {
		for _, t := range namesOf(i) {
			if t == selector || canonical(t) == canonical(selector) || tagOf(t) == selector {
				if found >= 0 && found != i {
					return 0, "", fmt.Errorf("several images match %q (%s)", selector, describe())
				}
				found, tag = i, t
				break
			}
		}
	}
	if found < 0 {
		return 0, "", fmt.Errorf("no image named %q in it (it holds: %s)", selector, describe())
	}
	return found, tag, nil
}

// tagOf returns the tag of "repo:tag" (or a bare tag itself).
func tagOf(ref string) string {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ref
	}
	return ref[i+1:]
}

// fileImageName names an untagged image after its file: "/x/My_Image.tar" -> "my_image".
func fileImageName(p string) string {
	b := strings.ToLower(filepath.Base(p))
	for _, ext := range []string{".tar.gz", ".tgz", ".tar", ".oci"} {
		b = strings.TrimSuffix(b, ext)
	}
	var sb strings.Builder
	for _, r := range b {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			sb.WriteRune(r)
		} else {
			sb.WriteByte('-')
		}
	}
	out := strings.TrimLeft(sb.String(), "._-")
	if out == "" {
		return "image"
	}
	return out
}
