package paths

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnsafeRoot is wrapped by Ensure and Check when a state root (or an entry in it) could
// be controlled by someone other than root: another local user could otherwise create
// /dev/shm/lazyfork first and read every fork's memory, or swap a directory for a symlink.
var ErrUnsafeRoot = errors.New("unsafe state directory")

// Children LazyFork creates in each root; Ensure makes them 0700 up front.
var (
	rootChildren = []string{"containers", "images"}
	runChildren  = []string{"snapshots", "families", "mem"}
)

// Ensure makes LAZYFORK_ROOT and LAZYFORK_RUN usable: each is created 0700 if missing,
// and each (with every entry directly in it) must be owned by root, not a symlink, and not
// writable by group or others; directories that are only readable by others are
// tightened to 0700 (only root could have written them). Anything else is refused with
// the fix in the message. Every directory above a root must be owned by root and, if
// others may write it (/dev/shm, /tmp), sticky, so nobody can rename the root away.
// The porcelain, the daemon and the stages call it before touching state.
//
// Run by someone other than root (a stage on a CRIU image for teaching), Ensure is Check.
func Ensure() error {
	// Both are checked before either is created, so a refusal changes nothing.
	if err := Check(); err != nil || os.Geteuid() != 0 {
		return err
	}
	if err := ensureRoot(Root(), "LAZYFORK_ROOT", rootChildren, true); err != nil {
		return err
	}
	return ensureRoot(Run(), "LAZYFORK_RUN", runChildren, true)
}

// Check verifies the roots that exist, as Ensure does, but creates and changes nothing.
func Check() error {
	if err := ensureRoot(Root(), "LAZYFORK_ROOT", nil, false); err != nil {
		return err
	}
	return ensureRoot(Run(), "LAZYFORK_RUN", nil, false)
}

// ensureRoot checks (with create: creates and tightens) one root.
func ensureRoot(root, env string, children []string, create bool) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s; remove it or set %s to another directory", ErrUnsafeRoot, fmt.Sprintf(format, args...), env)
	}
	if !filepath.IsAbs(root) {
		return fmt.Errorf("%w: %s=%q is not an absolute path; set %s to an absolute directory", ErrUnsafeRoot, env, root, env)
	}
	if err := checkAncestors(filepath.Dir(root), env); err != nil {
		return err
	}
	if create {
		if err := os.Mkdir(root, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create %s (%s): %w", root, env, err)
		}
	}
	fd, err := openDirNoFollow(unix.AT_FDCWD, root)
	if (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES)) && !create {
		return nil // nothing there yet, or not ours to read (run as another user)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return fail("%s is a symlink or not a directory", root)
		}
		return fmt.Errorf("open %s (%s): %w", root, env, err)
	}
	defer unix.Close(fd)
	if err := secureDir(fd, root, create); err != nil {
		return fail("%v", err)
	}
	for _, c := range children {
		if err := unix.Mkdirat(fd, c, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create %s: %w", filepath.Join(root, c), err)
		}
	}
	return checkEntries(fd, root, env, create)
}

// checkEntries checks every entry directly in the root dirfd. An entry that is a symlink
// is refused, except that LAZYFORK_ROOT/images may be a root-owned symlink to a shared
// image store that itself passes the checks (only root can have made it, in a 0700 root).
func checkEntries(fd int, root, env string, tighten bool) error {
	f := os.NewFile(uintptr(mustDup(fd)), root)
	if f == nil {
		return fmt.Errorf("read %s: dup failed", root)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", root, err)
	}
	for _, n := range names {
		p := filepath.Join(root, n)
		fail := func(format string, args ...any) error {
			return fmt.Errorf("%w: %s; remove %s or set %s to another directory", ErrUnsafeRoot, fmt.Sprintf(format, args...), p, env)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if st.Uid != 0 {
			return fail("%s is owned by uid %d, not root", p, st.Uid)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			if env != "LAZYFORK_ROOT" || n != "images" {
				return fail("%s is a symlink", p)
			}
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				return fail("%s is a broken symlink: %v", p, err)
			}
			if err := checkAncestors(filepath.Dir(real), env); err != nil {
				return err
			}
			cfd, err := openDirNoFollow(unix.AT_FDCWD, real)
			if err != nil {
				return fail("%s leads to %s, not a directory: %v", p, real, err)
			}
			err = secureDir(cfd, real, tighten)
			unix.Close(cfd)
			if err != nil {
				return fail("%s is a symlink to an unsafe image store (%v)", p, err)
			}
		case unix.S_IFDIR:
			cfd, err := openDirNoFollow(fd, n)
			if err != nil {
				return fmt.Errorf("open %s: %w", p, err)
			}
			err = secureDir(cfd, p, tighten)
			unix.Close(cfd)
			if err != nil {
				return fail("%v", err)
			}
		default:
			if st.Mode&0o022 != 0 {
				return fail("%s has mode %04o, writable by others", p, st.Mode&0o7777)
			}
		}
	}
	return nil
}

func mustDup(fd int) int {
	d, err := unix.Dup(fd)
	if err != nil {
		return -1
	}
	unix.CloseOnExec(d)
	return d
}

// secureDir checks an open directory: owned by root, not writable by group or others
// (someone else may have planted entries); with tighten, readable or searchable by
// others is made 0700.
func secureDir(fd int, p string, tighten bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", p)
	}
	if st.Uid != 0 {
		return fmt.Errorf("%s is owned by uid %d, not root", p, st.Uid)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%s has mode %04o, writable by others", p, st.Mode&0o7777)
	}
	if tighten && st.Mode&0o7777 != 0o700 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return fmt.Errorf("make %s mode 0700: %w", p, err)
		}
	}
	return nil
}

// checkAncestors refuses a root below a directory someone other than root controls: each
// directory from / down to dir (symlinks resolved: /var/run may lead to /run) must be
// owned by root, and sticky if group or others may write it.
func checkAncestors(dir, env string) error {
	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, os.ErrNotExist) {
		// Let the create fail with its own error, but not below someone else's dir.
		return checkAncestors(filepath.Dir(dir), env)
	}
	if err != nil {
		return fmt.Errorf("resolve %s (%s): %w", dir, env, err)
	}
	p := "/"
	for _, c := range append([]string{""}, strings.Split(strings.TrimPrefix(real, "/"), "/")...) {
		p = filepath.Join(p, c)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("stat %s (%s): %w", p, env, err)
		}
		if st.Uid != 0 {
			return fmt.Errorf("%w: %s, above the state directory, is owned by uid %d, not root; set %s to a directory under root-owned parents", ErrUnsafeRoot, p, st.Uid, env)
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("%w: %s, above the state directory, has mode %04o (writable by others, not sticky); set %s to a directory under root-owned parents", ErrUnsafeRoot, p, st.Mode&0o7777, env)
		}
	}
	return nil
}

func openDirNoFollow(dirfd int, p string) (int, error) {
	return unix.Openat(dirfd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}
