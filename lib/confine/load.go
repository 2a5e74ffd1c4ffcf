package confine

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// bpfMaxInsns is the kernel's limit on a classic BPF program (BPF_MAXINSNS).
const bpfMaxInsns = 4096

// loadFilter installs prog for every thread of the process. no_new_privs (or
// CAP_SYS_ADMIN) must already hold.
func loadFilter(prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("confine: load seccomp filter (%d instructions): %w", len(prog), errno)
	}
	if r != 0 {
		// With TSYNC a positive return names a thread that could not take the filter.
		return fmt.Errorf("confine: load seccomp filter: thread %d could not be synchronised", r)
	}
	return nil
}
