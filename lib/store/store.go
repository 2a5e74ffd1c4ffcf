// Package store is LazyFork's on-disk store: one directory per container (and per
// snapshot) holding small JSON files written atomically. It is the lineage record the
// fork pipeline reads and writes; no database is involved.
package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfork/lazyfork/lib/confine"
	"github.com/lazyfork/lazyfork/lib/exitcode"
	"github.com/lazyfork/lazyfork/lib/fsutil"
	"github.com/lazyfork/lazyfork/lib/resolve"
)

// RecordVersion is the version of container.json this code writes and accepts.
const RecordVersion = 1

// States a container can be in.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateFrozen   = "frozen"
	StateStopped  = "stopped" // snapshotted and ended by the user; forkable, startable
	StateExited   = "exited"  // its processes ended on their own
)

// Errors of the store; each carries the exit status a command gives it (lib/exitcode).
var (
	ErrNotFound  = exitcode.NewNotFound("no such container")
	ErrNameInUse = errors.New("name already in use")
	ErrBadName   = exitcode.Kind{Msg: "invalid name", Code: exitcode.Usage}
)

// Container is one container's record (container.json).
type Container struct {
	Version    int       `json:"version"`
	ID         string    `json:"id"`
	Name       string    `json:"name,omitempty"`
	Image      string    `json:"image"`
	Command    []string  `json:"command"`
	Env        []string  `json:"env,omitempty"`
	WorkingDir string    `json:"working_dir,omitempty"`
	Hostname   string    `json:"hostname"`
	Parent     string    `json:"parent,omitempty"`
	Depth      int       `json:"depth"`
	Created    time.Time `json:"created"`

	// Filesystem: Lower is top-most first (frozen ancestor layers, then image layers).
	Lower  []string `json:"lower"`
	Upper  string   `json:"upper"`
	Work   string   `json:"work"`
	RootFS string   `json:"rootfs"`
	// MemDir is the host directory bound read-only at /.lazyfork/mem inside.
	MemDir string `json:"mem_dir"`
	Family string `json:"family,omitempty"`

	Cgroup   map[string]string `json:"cgroup"`
	CgroupV2 bool              `json:"cgroup_v2,omitempty"`
	// Memory (bytes) and PidsLimit are the cgroup limits given at create (0: none); forks
	// keep them (CRIU copies the limits into each fork's cgroup).
	Memory    int64 `json:"memory,omitempty"`
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// Net is the network mode: "none" (a network namespace of its own with loopback only;
	// each fork gets its own) or "host" (the host's). "" is a record from before network
	// namespaces: host.
	Net string `json:"net,omitempty"`
	// Bridge mode only: the host bridge, the container's address with the subnet's prefix
	// ("10.88.0.2/16"; the records are the allocation, see lib/network) and whether its
	// outbound traffic is masqueraded (--nat).
	Bridge string `json:"bridge,omitempty"`
	Addr   string `json:"addr,omitempty"`
	NAT    bool   `json:"nat,omitempty"`
	// Cluster is the id of the container whose network namespace this one shares (its
	// leader, which names itself): the members of a cluster are forked as one cut and
	// every fork of the cluster gets one namespace holding all of them.
	Cluster string `json:"cluster,omitempty"`
	// Confine is how every process in the container is confined; a process started inside
	// it (exec, shell) must Apply it before its execve. A record without it was created
	// before confinement existed and runs privileged: see ConfineProfile.
	Confine *confine.Profile `json:"confine,omitempty"`

	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	State     string `json:"state"`
	// Snapshot is the snapshot a stopped container restarts from.
	Snapshot string `json:"snapshot,omitempty"`
	Hook     string `json:"hook,omitempty"`
	// Owner is the pid of the process building a record in state "creating"; a record
	// whose owner is gone was abandoned half-way and is garbage.
	Owner int `json:"owner,omitempty"`

	// Timings of the fork that made this container, for stats.
	Timings map[string]float64 `json:"timings_ms,omitempty"`
}

// Display is how messages name the container: its name, or its id when it has none.
func (c *Container) Display() string {
	if c.Name != "" {
		return c.Name
	}
	return c.ID
}

// ConfineProfile is the confinement of the container's processes: the recorded one, or
// for records written before LazyFork confined containers, what they really run with
// (privileged, as root).
func (c *Container) ConfineProfile() confine.Profile {
	if c.Confine == nil {
		return confine.Privileged()
	}
	return *c.Confine
}

// Store is a directory of container records.
type Store struct{ Dir string }

// Open makes sure the store directory exists.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	return &Store{Dir: dir}, nil
}

// Lock takes the store-wide lock (flock) that serialises name reservations.
func (s *Store) Lock() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(s.Dir, ".lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock store: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock store: %w", err)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// Path is the directory of one container.
func (s *Store) Path(id string) string { return filepath.Join(s.Dir, id) }

var idRe = regexp.MustCompile(`^[0-9a-f]{12}$`)

// NewID returns a fresh 12-hex-digit id not used in the store.
func (s *Store) NewID() string {
	return resolve.NewID("", func(id string) bool {
		_, err := os.Stat(s.Path(id))
		return !errors.Is(err, os.ErrNotExist)
	})
}

// nameRe is compiled on first use (its bounded repetition cost every start of every
// binary, the exec helper's included, ~0.3 ms).
var nameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`) })

// ValidateName checks a user-chosen container name.
func ValidateName(name string) error {
	if !nameRe().MatchString(name) {
		return fmt.Errorf("%w %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", ErrBadName, name)
	}
	if idRe.MatchString(name) {
		return fmt.Errorf("%w %q: a name must not look like a container id", ErrBadName, name)
	}
	return nil
}

// Put writes a record atomically, creating its directory.
func (s *Store) Put(c *Container) error {
	if !idRe.MatchString(c.ID) {
		return fmt.Errorf("put container: bad id %q", c.ID)
	}
	c.Version = RecordVersion
	if err := os.MkdirAll(s.Path(c.ID), 0o700); err != nil {
		return fmt.Errorf("put container %s: %w", c.ID, err)
	}
	return fsutil.WriteJSON(filepath.Join(s.Path(c.ID), "container.json"), c)
}

// Update rewrites the record of a container that Put wrote before, atomically, without
// waiting for the disk (fsutil.ReplaceJSON): for changes a crash of the machine may lose,
// such as the pid of a fork that did not outlive it either. Until the file system commits,
// such a crash leaves the record Put wrote, which names everything GC must clean.
func (s *Store) Update(c *Container) error {
	if !idRe.MatchString(c.ID) {
		return fmt.Errorf("update container: bad id %q", c.ID)
	}
	c.Version = RecordVersion
	return fsutil.ReplaceJSON(filepath.Join(s.Path(c.ID), "container.json"), c)
}

// Get reads one record by exact id.
func (s *Store) Get(id string) (*Container, error) {
	if !idRe.MatchString(id) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	var c Container
	if err := fsutil.ReadJSON(filepath.Join(s.Path(id), "container.json"), &c); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return nil, err
	}
	if c.Version != RecordVersion {
		return nil, fmt.Errorf("container %s: record version %d not supported (want %d)", id, c.Version, RecordVersion)
	}
	return &c, nil
}

// List returns every record, oldest first.
func (s *Store) List() ([]*Container, error) {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var out []*Container
	for _, e := range ents {
		if !e.IsDir() || !idRe.MatchString(e.Name()) {
			continue
		}
		c, err := s.Get(e.Name())
		if err != nil {
			continue // a directory being created or removed right now
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Created.Equal(out[j].Created) {
			return out[i].ID < out[j].ID
		}
		return out[i].Created.Before(out[j].Created)
	})
	return out, nil
}

// Resolve finds a container by name, id, or unique id prefix.
func (s *Store) Resolve(ref string) (*Container, error) {
	if ref == "" {
		return nil, fmt.Errorf("%w: empty reference", ErrNotFound)
	}
	// A whole id names its record directly (no name looks like an id): reading every record
	// for it made deleting N containers read N records N times.
	if idRe.MatchString(ref) {
		if c, err := s.Get(ref); err == nil {
			return c, nil
		}
	}
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	c, found, err := resolve.Find(all, ref, "container", 1, func(c *Container) (string, string) { return c.ID, c.Name })
	if err == nil && !found {
		err = fmt.Errorf("%w %q (see: lazyfork list)", ErrNotFound, ref)
	}
	return c, err
}

// NamesInUse maps the name of every named record to its id. Hold the lock when the answer
// must stay true until you write (Reserve).
func (s *Store) NamesInUse() (map[string]string, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	taken := map[string]string{}
	for _, c := range all {
		if c.Name != "" {
			taken[c.Name] = c.ID
		}
	}
	return taken, nil
}

// CheckNamesFree fails if a record already uses one of names, or a name is given twice;
// it reads the store once however many names there are.
func (s *Store) CheckNamesFree(names []string) error {
	if len(names) == 0 {
		return nil
	}
	taken, err := s.NamesInUse()
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, name := range names {
		if id, ok := taken[name]; ok {
			return fmt.Errorf("%w: %q is container %s (pick another name or delete it)", ErrNameInUse, name, id)
		}
		if seen[name] {
			return fmt.Errorf("%w: %q is given twice", ErrNameInUse, name)
		}
		seen[name] = true
	}
	return nil
}

// Remove deletes a container's directory (never crossing a mount point).
func (s *Store) Remove(id string) error {
	if !idRe.MatchString(id) {
		return fmt.Errorf("remove container: bad id %q", id)
	}
	return fsutil.RemoveAll(s.Path(id))
}

// Children lists the records whose parent is id.
func (s *Store) Children(id string) ([]*Container, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	var out []*Container
	for _, c := range all {
		if c.Parent == id {
			out = append(out, c)
		}
	}
	return out, nil
}
