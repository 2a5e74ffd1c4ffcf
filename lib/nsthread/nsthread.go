// Package nsthread runs a function inside another process's namespace without moving the
// caller: on an OS thread of its own that joins the namespace and is thrown away afterwards
// (the goroutine ends locked, so Go ends the thread with it and no other goroutine ever
// runs in the foreign namespace).
package nsthread

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// A goroutine locked to the main thread would take a namespace change with it and never
// end (Go parks the main thread instead), holding the namespace alive: locked to the main
// goroutine from init, the main thread never runs one of Run's (lib/network and lib/criu
// do the same for their own such threads).
func init() { runtime.LockOSThread() }

// Run runs fn on a throwaway thread that joined the namespace ns (a /proc/PID/ns/... file
// or a bind mount of one) of type nstype (unix.CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWNS...).
func Run(ns *os.File, nstype int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if nstype == unix.CLONE_NEWNS {
			// setns(CLONE_NEWNS) refuses a thread that shares its fs_struct (Go's threads do).
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				errc <- fmt.Errorf("unshare the file system attributes: %w", err)
				return
			}
		}
		if err := unix.Setns(int(ns.Fd()), nstype); err != nil {
			errc <- fmt.Errorf("join namespace %s: %w", ns.Name(), err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// RunPid is Run in the namespace of type nstype ("net", "uts", "mnt"...) of process pid.
func RunPid(pid int, kind string, nstype int, fn func() error) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
	if err != nil {
		return err
	}
	defer ns.Close()
	return Run(ns, nstype, fn)
}

// RunInRoot runs fn on a throwaway thread in the mount namespace of process pid, with
// that process's root as its own (nsenter -m -r). Joining a mount namespace alone puts the
// thread at the namespace's first mount and whatever is stacked on its "/", which is not
// always the process's root: where the host's root was made by pivot_root (the v2 test
// guest), the thread saw an empty rootfs and no /tmp.
func RunInRoot(pid int, fn func() error) error {
	root, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return err
	}
	defer root.Close()
	return RunPid(pid, "mnt", unix.CLONE_NEWNS, func() error {
		if err := unix.Fchdir(int(root.Fd())); err != nil {
			return fmt.Errorf("enter the root of process %d: %w", pid, err)
		}
		if err := unix.Chroot("."); err != nil {
			return fmt.Errorf("enter the root of process %d: %w", pid, err)
		}
		return fn()
	})
}
