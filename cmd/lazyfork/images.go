package main

import (
	"context"
	"fmt"
	"os"

	"github.com/lazyfork/lazyfork/lib/image"
)

type imageCmd struct {
	Pull         imagePullCmd   `cmd:"" help:"Fetch an image (registry reference, OCI layout dir or docker-save tarball) into the store."`
	List         imageListCmd   `cmd:"" aliases:"ls" help:"List images in the store."`
	Rm           imageRmCmd     `cmd:"" help:"Remove an image from the store."`
	ImportDir    imageImportCmd `cmd:"" name:"import-dir" help:"Register a root file system directory as a one-layer image."`
	BuildDefault imageBuildCmd  `cmd:"" name:"build-default" help:"Build the offline default image (lazyfork/debian:bookworm) with debootstrap."`
}

func openImages(g *Globals) (*image.Store, error) {
	if _, err := g.open(); err != nil {
		return nil, err
	}
	return image.Open(g.Root + "/images")
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
	if c.JSON {
		return printJSON(img)
	}
	fmt.Println(img.Name)
	return nil
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
	s, err := openImages(g)
	if err != nil {
		return err
	}
	for _, n := range c.Names {
		if err := s.Remove(n); err != nil {
			return err
		}
		fmt.Println(n)
	}
	return nil
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
