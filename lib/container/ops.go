package container

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/lazyfork/lazyfork/lib/cgroup"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/overlay"
	"github.com/lazyfork/lazyfork/lib/store"
)

// ExecOptions describe a command run inside a running container.
type ExecOptions struct {
	Args    []string
	Env     []string // added to the container's environment (which only the command sees)
	Cwd     string   // inside the container; "" = the image's working directory
	Stdin   io.Reader
	Stdout  io.Writer // nil: captured into the result
	Stderr  io.Writer // nil: captured into the result
	Timeout time.Duration
	// MaxOutput bounds each captured stream (0: MaxExecOutput); over it, the command is
	// killed and Exec fails with ErrExecOutputLimit. Streams given as writers are not
	// bounded.
	MaxOutput int
}

// ExecResult is what exec returns (its JSON form is the --json output).
type ExecResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
}

// check refuses op on c unless its live state allows it (lib/guard's state machine).
func (r *Runtime) check(op guard.Op, c *store.Container) error {
	return guard.Check(op, c, r.State(c))
}

// State is the container's live state, derived from its process and cgroup rather than
// trusted from the record.
func (r *Runtime) State(c *store.Container) string {
	switch c.State {
	case store.StateStopped, store.StateCreating:
		return c.State
	}
	if !Alive(c) {
		return store.StateExited
	}
	// Only the freezer's state: the whole accounting (Stats) read every hierarchy's
	// files for each check of an exec or a fork.
	if cg, err := Cgroup(c); err == nil {
		if frozen, err := cg.Frozen(); err == nil && frozen {
			return store.StateFrozen
		}
	}
	return store.StateRunning
}

// Freeze pauses every process of the container.
func (r *Runtime) Freeze(c *store.Container) error {
	return r.freezer(guard.OpFreeze, c, (*cgroup.Cgroup).Freeze)
}

// Thaw resumes a frozen container.
func (r *Runtime) Thaw(c *store.Container) error {
	return r.freezer(guard.OpThaw, c, (*cgroup.Cgroup).Thaw)
}

// freezer checks that op is allowed in c's state, then applies it to c's group.
func (r *Runtime) freezer(op guard.Op, c *store.Container, apply func(*cgroup.Cgroup) error) error {
	if err := r.check(op, c); err != nil {
		return err
	}
	cg, err := Cgroup(c)
	if err == nil {
		err = apply(cg)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, c.Display(), err)
	}
	return nil
}

// Delete ends the container's processes and removes its mounts, cgroup, upper layer,
// memory directory and record. Children of a forked container keep running.
func (r *Runtime) Delete(c *store.Container) error {
	var errs []error
	if cg, err := Cgroup(c); err == nil {
		if err := cg.Kill(); err != nil {
			errs = append(errs, err)
		} else if err := cg.Remove(); err != nil {
			errs = append(errs, err)
		}
	} else if cgroup.CheckOwned(c.Cgroup) == nil {
		// Not in every hierarchy (Load refuses it): a creation or removal cut short. What
		// is left goes, or it would outlive the record (empty memory groups did).
		// A forged record (paths naming different groups) aims it nowhere, as Load would.
		if err := cgroup.RemoveOwned(c.Cgroup); err != nil && !errors.Is(err, cgroup.ErrForeign) {
			errs = append(errs, err)
		}
	}
	// The conventional paths, not the record's: a damaged record must not aim removal
	// anywhere else.
	if err := overlay.Teardown(overlay.Dir(r.Containers.Path(c.ID), nil)); err != nil {
		errs = append(errs, err)
	}
	// A source moved onto its snapshot (lib/fork.Swap) mounts its root at rootfs-<snapshot>
	// with work-<snapshot>, conventional names inside its own directory.
	swapped, _ := filepath.Glob(filepath.Join(r.Containers.Path(c.ID), "rootfs-s*"))
	for _, root := range swapped {
		work := filepath.Join(filepath.Dir(root), "work-"+strings.TrimPrefix(filepath.Base(root), "rootfs-"))
		conv := overlay.Dir(r.Containers.Path(c.ID), nil)
		if err := overlay.Teardown(overlay.Layer{Target: root, Work: work, Upper: conv.Upper}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := fsutil.RemoveAll(MemDir(c.ID)); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := r.Containers.Remove(c.ID); err != nil {
			errs = append(errs, err)
		}
	}
	// After the record: the address is free once no record holds it, and the bridge
	// goes with its last container.
	if err := r.releaseNetwork(c); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete %s: %w", c.Display(), err)
	}
	return nil
}

// Info is one row of `lazyfork list` (store.Info, the API's container object), built here.
type Info = store.Info

// Inspect builds the live view of one container.
func (r *Runtime) Inspect(c *store.Container) Info {
	in := Info{ID: c.ID, Name: c.Name, State: r.State(c), Parent: c.Parent, Depth: c.Depth,
		Image: c.Image, Command: c.Command, Created: c.Created, Hook: c.Hook,
		Net: c.Net, Bridge: c.Bridge, NAT: c.NAT, Cluster: c.Cluster}
	if in.Net == "" {
		in.Net = NetHost // a record from before network namespaces
	}
	if p, err := netip.ParsePrefix(c.Addr); err == nil {
		in.Address = p.Addr().String()
	}
	if in.State == store.StateRunning || in.State == store.StateFrozen {
		in.Pid = c.Pid
	}
	if cg, err := Cgroup(c); err == nil {
		if st, err := cg.Stats(); err == nil {
			in.Procs = st.Pids
			in.MemoryBytes = int64(st.MemoryBytes)
		}
	}
	return in
}

// List returns the live view of every container, with parent names filled in.
func (r *Runtime) List() ([]Info, error) {
	all, err := r.Containers.List()
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, c := range all {
		names[c.ID] = c.Name
	}
	out := make([]Info, 0, len(all))
	for _, c := range all {
		in := r.Inspect(c)
		in.ParentName = names[c.Parent]
		out = append(out, in)
	}
	return out, nil
}

// LogPath is the host path of the container's output log. The container controls what is
// there (a symlink, a fifo): read it with OpenLog, never by this path.
func LogPath(c *store.Container) string {
	if fsutil.IsMountPoint(c.RootFS) {
		return c.RootFS + OutputLog
	}
	return c.Upper + OutputLog
}
