package confine

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// maxAccountFile bounds what is read of an image's /etc/passwd or /etc/group.
const maxAccountFile = 4 << 20

// ResolveUser sets p's UID, GID, Groups and Home from spec ("", "name", "uid",
// "name:group", "uid:gid", ...), looking names up in the /etc/passwd and /etc/group of
// the container root at rootfs (a host path). The files are opened with openat2
// RESOLVE_IN_ROOT, so an image's symlink (/etc/passwd -> /host/file) resolves inside the
// root, never on the host. As Docker: "" is root; a numeric uid absent from /etc/passwd
// gets gid 0; the user's supplementary groups come from /etc/group.
func (p *Profile) ResolveUser(rootfs, spec string) error {
	p.User = spec
	p.UID, p.GID, p.Groups, p.Home = 0, 0, nil, ""
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" {
		if hasGroup {
			return fmt.Errorf("user %q: name the user before the ':' (e.g. 1000:1000)", spec)
		}
		userPart = "0"
	}
	uid, numeric := parseID(userPart)
	_, groupNumeric := parseID(groupPart)
	allNumeric := numeric && (!hasGroup || groupNumeric)
	// An image whose account files are unreadable (absent, a loop of symlinks) still
	// runs numeric users, as Docker does; names need the files.
	passwd, err := readInRoot(rootfs, "/etc/passwd")
	if err != nil && !allNumeric {
		return err
	}
	name := ""
	found := false
	for _, f := range records(passwd, 7) {
		id, ok := parseID(f[2])
		if !ok {
			continue
		}
		if (numeric && id == uid) || (!numeric && f[0] == userPart) {
			gid, _ := parseID(f[3])
			name, p.UID, p.GID, p.Home, found = f[0], id, gid, f[5], true
			break
		}
	}
	if !found {
		if !numeric {
			return fmt.Errorf("user %q is not in the image's /etc/passwd: use a numeric uid or a user the image has", userPart)
		}
		p.UID = uid
	}
	group, err := readInRoot(rootfs, "/etc/group")
	if err != nil && !allNumeric {
		return err
	}
	groups := records(group, 4)
	if hasGroup {
		gid, numeric := parseID(groupPart)
		if !numeric {
			found := false
			for _, f := range groups {
				if id, ok := parseID(f[2]); ok && f[0] == groupPart {
					gid, found = id, true
					break
				}
			}
			if !found {
				return fmt.Errorf("group %q is not in the image's /etc/group: use a numeric gid or a group the image has", groupPart)
			}
		}
		p.GID = gid
	}
	if name != "" {
		for _, f := range groups {
			id, ok := parseID(f[2])
			if !ok || id == p.GID {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == name {
					p.Groups = append(p.Groups, id)
					break
				}
			}
		}
	}
	return nil
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 { // (uid_t)-1 means "unchanged" to the kernel
		return 0, false
	}
	return uint32(n), true
}

// records splits a colon-separated account file into lines of at least n fields.
func records(data []byte, n int) [][]string {
	var out [][]string
	s := bufio.NewScanner(strings.NewReader(string(data)))
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) >= n {
			out = append(out, f)
		}
	}
	return out
}

// readInRoot reads a regular file of the tree at root, resolving path as if root were
// "/". A missing file reads as empty.
func readInRoot(root, path string) ([]byte, error) {
	f, err := OpenInRoot(root, path, unix.O_RDONLY)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the image's %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read the image's %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("read the image's %s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxAccountFile+1))
	if err != nil {
		return nil, fmt.Errorf("read the image's %s: %w", path, err)
	}
	if len(b) > maxAccountFile {
		return nil, fmt.Errorf("read the image's %s: larger than %d bytes", path, maxAccountFile)
	}
	return b, nil
}

// OpenInRoot opens path inside the directory tree at root as if root were "/": symlinks
// and ".." cannot leave it, and /proc magic links are refused (openat2 RESOLVE_IN_ROOT |
// RESOLVE_NO_MAGICLINKS). Use it for every host-side access to a container's files.
func OpenInRoot(root, path string, flags int) (*os.File, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", root, err)
	}
	defer unix.Close(rfd)
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(rfd, path, &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // a concurrent rename inside the root; try again
		}
		if err != nil {
			return nil, &os.PathError{Op: "openat2", Path: path, Err: err}
		}
		return os.NewFile(uintptr(fd), path), nil
	}
}
