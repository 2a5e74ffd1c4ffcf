package memfile

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/checkpoint-restore/go-criu/v8/crit/images/fdinfo"
)

// ReferencedFiles lists the family memory files a checkpoint needs to restore: every
// regular file in its files.img under the family mount (DefaultMountPath), by base name,
// sorted. Whatever maps or opens a memory file names it there, so these are the files
// that must exist in the family directory for a restore (and the only ones).
func ReferencedFiles(checkpointDir string) ([]string, error) {
	if err := checkCheckpointDir(checkpointDir); err != nil {
		return nil, err
	}
	img, err := loadImage(checkpointDir, "files.img", "FILES", &fdinfo.FileEntry{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range img.Entries {
		reg := e.Message.(*fdinfo.FileEntry).GetReg()
		if reg == nil {
			continue
		}
		name := reg.GetName()
		rest, ok := strings.CutPrefix(name, DefaultMountPath+"/")
		if !ok {
			continue
		}
		if rest == "" || strings.Contains(rest, "/") || rest != filepath.Clean(rest) || rest == ".." {
			return nil, fmt.Errorf("image %s names memory file %q: not a file of the family directory", checkpointDir, name)
		}
		out = append(out, rest)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
