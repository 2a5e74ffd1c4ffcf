package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/image"
	"github.com/lazyfork/lazyfork/lib/store"
)

type imageCmd struct {
	Pull         imagePullCmd   `cmd:"" help:"Fetch an image (registry reference, OCI layout dir or docker-save tarball) into the store."`
	List         imageListCmd   `cmd:"" aliases:"ls" help:"List images in the store."`
	Rm           imageRmCmd     `cmd:"" help:"Remove an image from the store."`
	ImportDir    imageImportCmd `cmd:"" name:"import-dir" help:"Register a root file system directory as a one-layer image."`
	BuildDefault imageBuildCmd  `cmd:"" name:"build-default" help:"Build the offline default image (lazyfork/debian:bookworm) with debootstrap."`
}

// openImages opens the image store as the runtime does (with the operator's size limit).
func openImages(g *Globals) (*image.Store, error) {
	rt, err := open(g)
	if err != nil {
		return nil, err
	}
	return rt.Images, nil
}

type imagePullCmd struct {
	Ref  string `arg:"" help:"Image reference, OCI layout directory or docker-save tarball."`
	JSON bool   `help:"Print the image record as JSON."`
}

func (c *imagePullCmd) Run(ctx context.Context, g *Globals) error {
	s, err := openImages(g)
	if err != nil {
		return err
	}
	img, err := s.Get(ctx, c.Ref, image.GetOptions{Progress: os.Stderr})
	if err != nil {
		return err
	}
	return printResult(img, img.Name, c.JSON)
}

type imageListCmd struct {
	JSON bool `help:"Print JSON."`
}

func (c *imageListCmd) Run(g *Globals) error {
	s, err := openImages(g)
	if err != nil {
		return err
	}
	imgs, err := s.List()
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(imgs)
	}
	fmt.Printf("%-40s %-15s %7s %10s\n", "name", "source", "layers", "size")
	for _, im := range imgs {
		fmt.Printf("%-40s %-15s %7d %10s\n", im.Name, im.Source, len(im.Layers), humanBytes(im.Size))
	}
	return nil
}

type imageRmCmd struct {
	Names []string `arg:"" help:"Image names."`
}

func (c *imageRmCmd) Run(g *Globals) error {
	rt, err := open(g)
	if err != nil {
		return err
	}
	s := rt.Images
	for _, n := range c.Names {
		if err := s.RemoveUnused(n, func(name string, layers []string) ([]string, error) {
			return imageUsers(rt.Containers, name, layers)
		}); err != nil {
			return err
		}
		fmt.Println(n)
	}
	return nil
}

// imageUsers names the containers (running, stopped, being created) and snapshots that
// need one of layers or were made from the image name. A record it cannot read is an
// error: it might be a user.
func imageUsers(ts *store.Store, name string, layers []string) ([]string, error) {
	want := map[string]bool{}
	for _, l := range layers {
		want[realPath(l)] = true
	}
	needs := func(lower []string) bool {
		for _, l := range lower {
			if want[realPath(l)] {
				return true
			}
		}
		return false
	}
	var who []string
	ents, err := os.ReadDir(ts.Dir)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() || !recordID.MatchString(e.Name()) {
			continue
		}
		ct, err := ts.Get(e.Name())
		if err != nil {
			time.Sleep(100 * time.Millisecond) // a delete may be removing it right now
			if _, serr := os.Stat(filepath.Join(ts.Dir, e.Name())); errors.Is(serr, os.ErrNotExist) {
				continue
			}
			if ct, err = ts.Get(e.Name()); err != nil {
				return nil, fmt.Errorf("container record %s is unreadable (%v): fix or delete it first", e.Name(), err)
			}
		}
		if needs(ct.Lower) || (len(ct.Lower) == 0 && ct.Image == name) {
			who = append(who, "container "+label(ct.Name, ct.ID))
		}
	}
	snaps, err := fork.Snapshots()
	if err != nil {
		return nil, err
	}
	for _, sn := range snaps {
		if needs(sn.Lower) || needs([]string{sn.Layer}) {
			who = append(who, "snapshot "+sn.ID+" (of "+label(sn.Source.Name, sn.Source.ID)+")")
		}
	}
	return who, nil
}

var recordID = regexp.MustCompile(`^[0-9a-f]{12}$`)

func label(name, id string) string {
	if name != "" {
		return name + " (" + id + ")"
	}
	return id
}

// realPath resolves symlinks (a shared image store linked into LAZYFORK_ROOT), or keeps p.
func realPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

type imageImportCmd struct {
	Dir  string `arg:"" help:"Root file system directory (moved into the store)."`
	Name string `required:"" help:"Local name for the image."`
}

func (c *imageImportCmd) Run(g *Globals) error {
	s, err := openImages(g)
	if err != nil {
		return err
	}
	img, err := s.ImportDir(c.Dir, c.Name)
	if err != nil {
		return err
	}
	fmt.Println(img.Name)
	return nil
}

type imageBuildCmd struct{}

func (c *imageBuildCmd) Run(ctx context.Context, g *Globals) error {
	s, err := openImages(g)
	if err != nil {
		return err
	}
	img, err := s.BuildDefault(ctx, os.Stderr)
	if err != nil {
		return err
	}
	fmt.Println(img.Name)
	return nil
}
