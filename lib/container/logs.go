package container

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/store"
)

// ErrLogNotRegular is wrapped by OpenLog's error when the container's output log is not a
// regular file (a symlink, a fifo, a device node: what a workload may put there).
var ErrLogNotRegular = errors.New("output log is not a regular file")

// OpenLog opens the container's output log for reading, from the host, as the container
// sees it: resolved inside the container's root (its merged root while mounted, else its
// upper layer) with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_XDEV), the last component never
// followed, and only a regular file accepted. The container owns that file: a symlink to
// a host file, a fifo (which would block the reader) or a device node are refused, and
// nothing else is opened first (the file is looked at through an O_PATH descriptor and
// reopened through it only once it is known to be a regular file).
func OpenLog(c *store.Container) (*os.File, error) {
	root := c.Upper
	if fsutil.IsMountPoint(c.RootFS) {
		root = c.RootFS
	}
	fail := func(err error) (*os.File, error) { return nil, fmt.Errorf("logs of %s: %w", c.Display(), err) }
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("open its root %s: %w", root, err))
	}
	defer unix.Close(rfd)
	rel := strings.TrimPrefix(OutputLog, "/")
	pfd, err := unix.Openat2(rfd, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fail(fmt.Errorf("%s does not exist in the container (yet)", OutputLog))
		}
		return fail(fmt.Errorf("open %s inside the container: %w", OutputLog, err))
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return fail(fmt.Errorf("stat %s: %w", OutputLog, err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail(fmt.Errorf("%w: %s is %s inside the container; not reading it", ErrLogNotRegular, OutputLog, fileKind(st.Mode)))
	}
	// Reopening the O_PATH descriptor reaches exactly the inode just checked.
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("open %s: %w", OutputLog, err))
	}
	return os.NewFile(uintptr(fd), root+OutputLog), nil
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFIFO:
		return "a fifo"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFDIR:
		return "a directory"
	}
	return fmt.Sprintf("of type %o", mode&unix.S_IFMT)
}
