// Package stage defines the JSON documents the pipeline stages exchange on stdin and
// stdout (lf-dump | lf-memfile | lf-restore). Each carries a kind and a version; readers
// reject other versions. Fields are only ever added, never renamed. docs/stages.md
// describes them for users.
package stage

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/lazyfork/lazyfork/lib/confine"
)

const (
	KindSnapshot = "lazyfork.snapshot"
	KindFork     = "lazyfork.fork"
	Version      = 1
)

// Snapshot states, in pipeline order.
const (
	SnapDumping  = "dumping"
	SnapDumped   = "dumped"   // checkpoint written, memory still in it
	SnapMemfiled = "memfiled" // memory moved into the family's memory files: restorable as forks
)

// Source names the container a snapshot was taken of.
type Source struct {
	ID    string `json:"id"`
	Name  string `json:"name,omitempty"`
	Depth int    `json:"depth"`
	Pid   int    `json:"pid"`
}

// Snapshot is printed by lf-dump (state "dumped") and lf-memfile (state "memfiled"),
// read by lf-memfile and lf-restore, and kept as snapshot.json in the snapshot directory.
type Snapshot struct {
	Kind          string    `json:"kind"`
	Version       int       `json:"version"`
	ID            string    `json:"id"`
	State         string    `json:"state"`
	Dir           string    `json:"dir"`        // snapshot directory on tmpfs
	CheckpointDir string    `json:"images_dir"` // the checkpoint: CRIU's image directory (read-only once memfiled)
	Created       time.Time `json:"created"`
	Source        Source    `json:"source"`
	// Owner is the pid of the process using the snapshot as a transient step (a dump in
	// progress, a porcelain fork); once that process is gone the snapshot is garbage.
	Owner int `json:"owner,omitempty"`
	// LeftRunning is false when the dump ended the source (lf-dump --exit, lazyfork stop).
	LeftRunning bool `json:"left_running"`
	// Swap: the source was left frozen with its upper directory moved to Layer, to be
	// restored from this snapshot in place (lazyfork fork's default); see lib/fork.Swap.
	Swap bool `json:"swap,omitempty"`
	// SwapMs: how long the swap took to restore the source and end the old processes,
	// which stayed frozen meanwhile (its pause is the dump's frozen part, the rewrite and
	// this).
	SwapMs float64 `json:"swap_ms,omitempty"`

	// Family is the set of memory files this snapshot's forks map; FamilyDir holds them
	// on tmpfs and is bound read-only at /.lazyfork/mem in every fork.
	Family    string `json:"family"`
	FamilyDir string `json:"family_dir"`
	// Layer is the source's upper directory frozen at the dump; Lower is the full
	// read-only stack a fork mounts under its own upper (top-most first, Layer first).
	Layer string   `json:"layer"`
	Lower []string `json:"lower"`

	// What a fork runs, copied from the source's record.
	Image      string   `json:"image"`
	Command    []string `json:"command"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	Hook       string   `json:"hook,omitempty"`
	// Confine and the limits are the source's: each fork's record gets them and its
	// cgroup is given the limits again (CRIU restores capabilities, no_new_privs and
	// the seccomp filter from the image, but not limits into a group it did not create).
	Confine   *confine.Profile `json:"confine,omitempty"`
	Memory    int64            `json:"memory,omitempty"`
	PidsLimit int64            `json:"pids_limit,omitempty"`
	// Net is the source's network mode; each fork of a "none" source gets a network
	// namespace of its own: a fresh one with loopback up for a confined source (which
	// cannot have changed its own), CRIU's restore of the dumped one for a privileged one.
	Net string `json:"net,omitempty"`
	// Bridge mode: the source's bridge, address and --nat. Each fork gets an address of
	// the same subnet on the same bridge, in a namespace prepared before CRIU restores
	// into it; the fork's copies of sockets bound to Addr are closed (lib/network).
	Bridge string `json:"bridge,omitempty"`
	Addr   string `json:"addr,omitempty"`
	NAT    bool   `json:"nat,omitempty"`
	// SharedNetNS: a cluster member dumped from inside its cluster's namespace (which
	// the checkpoint does not hold); it restores only into a namespace made for the cluster's
	// fork (lib/fork.ForkCluster).
	SharedNetNS bool `json:"shared_netns,omitempty"`

	Dump    DumpStats     `json:"dump"`
	Memfile *MemfileStats `json:"memfile,omitempty"`
}

// DumpStats are lf-dump's measurements.
type DumpStats struct {
	WallMs          float64 `json:"wall_ms"`
	FrozenMs        float64 `json:"frozen_ms"` // how long the source's tasks were stopped
	LayerMs         float64 `json:"layer_ms"`  // copying the upper while frozen
	PagesWritten    uint64  `json:"pages_written"`
	PagesScanned    uint64  `json:"pages_scanned"`
	CheckpointBytes int64   `json:"image_bytes"`
	// PreallocMs and PreallocBytes: the memory files' pages allocated before the freeze
	// (a source's first swap), for the rewrite to write into.
	PreallocMs    float64 `json:"prealloc_ms,omitempty"`
	PreallocBytes int64   `json:"prealloc_bytes,omitempty"`
	// PreallocHugePages: the 2 MiB stretches of them allocated as one huge page each
	// (memfile.Preallocate): forks map those without page tables.
	PreallocHugePages int `json:"prealloc_huge_pages,omitempty"`
	// PreallocHugeSlow: fresh huge pages came slowly (memfile.HugePagesWhileFast), so the
	// stretches after the slow one were allocated in small pages.
	PreallocHugeSlow bool `json:"prealloc_huge_slow,omitempty"`
	// PagesPlaced: CRIU sent the pages to a page server that wrote each process's into
	// its memory file (<snapshot>-prealloc-<pid>.mem) at their addresses: the checkpoint's
	// pages images are empty until the rewrite, which needs those files, has run.
	PagesPlaced bool `json:"pages_placed,omitempty"`
}

// MemfileStats are lf-memfile's measurements.
type MemfileStats struct {
	Files             int     `json:"files"`
	VMAsConverted     int     `json:"vmas_converted"`
	FileVMAsConverted int     `json:"file_vmas_converted"`
	PagesMoved        int64   `json:"pages_moved"`
	PagesKept         int64   `json:"pages_kept"`
	SharedPages       int64   `json:"shared_pages"`
	DeltaPages        int64   `json:"delta_pages"`
	Rebased           bool    `json:"rebased"`
	BytesWritten      int64   `json:"bytes_written"`
	HugePages         int     `json:"huge_pages"`
	PreallocFiles     int     `json:"prealloc_files,omitempty"` // written into preallocated pages
	Ms                float64 `json:"ms"`
	MBPerSec          float64 `json:"mb_per_sec"`
}

// Fork is one line printed by lf-restore per fork.
type Fork struct {
	Kind      string  `json:"kind"`
	Version   int     `json:"version"`
	ID        string  `json:"id"`
	Name      string  `json:"name,omitempty"`
	Parent    string  `json:"parent"`
	Depth     int     `json:"depth"`
	Pid       int     `json:"pid"`
	Hostname  string  `json:"hostname"`
	Snapshot  string  `json:"snapshot"`
	Family    string  `json:"family"`
	RestoreMs float64 `json:"restore_ms"`
	// Address is the fork's IPv4 address in bridge mode.
	Address string `json:"address,omitempty"`
}

// ClusterMember is one member's part of a cluster fork: its snapshot, how long the cut
// paused it, and its copy in each fork of the cluster.
type ClusterMember struct {
	ID       string  `json:"id"`
	Name     string  `json:"name,omitempty"`
	Snapshot string  `json:"snapshot"`
	PauseMs  float64 `json:"pause_ms"`  // frozen from its freeze to the common thaw
	FrozenMs float64 `json:"frozen_ms"` // what CRIU reports for its own dump
	Forks    []Fork  `json:"forks"`     // its copy in fork i of the cluster
}

// ClusterFork is the result of ForkCluster (`lazyfork cluster fork --json`, lib/fork.ForkCluster).
type ClusterFork struct {
	Kind    string          `json:"kind"`
	Version int             `json:"version"`
	Cluster string          `json:"cluster"` // the source cluster's leader
	Members []ClusterMember `json:"members"`
	// Leaders are the new clusters: the leader's copy in each fork.
	Leaders []string `json:"leaders"`
}

// KindClusterFork is ClusterFork's kind.
const KindClusterFork = "lazyfork.cluster-fork"

// ReadSnapshot decodes a snapshot document and checks its kind and version.
func ReadSnapshot(r io.Reader) (*Snapshot, error) {
	var s Snapshot
	if err := json.NewDecoder(r).Decode(&s); err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("read snapshot JSON: no input (pipe in the output of lf-dump or lf-memfile, or pass a snapshot directory)")
		}
		return nil, fmt.Errorf("read snapshot JSON: %w", err)
	}
	if s.Kind != KindSnapshot {
		return nil, fmt.Errorf("read snapshot JSON: kind %q is not %q (pipe in the output of lf-dump or lf-memfile)", s.Kind, KindSnapshot)
	}
	if s.Version != Version {
		return nil, fmt.Errorf("read snapshot JSON: version %d not supported (want %d)", s.Version, Version)
	}
	return &s, nil
}

// Ms converts a duration to milliseconds for the JSON documents.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
