package store

import "time"

// Info is the live view of one container: its record with the state, processes and memory
// the runtime reads live. It is a row of `lazyfork list` and the API's container object
// (lib/client.Info), here so that both the runtime and the light API client share it.
type Info struct {
	ID          string    `json:"id"`
	Name        string    `json:"name,omitempty"`
	State       string    `json:"state"` // creating, running, frozen, stopped, exited
	Parent      string    `json:"parent,omitempty"`
	ParentName  string    `json:"parent_name,omitempty"`
	Depth       int       `json:"depth"`
	Pid         int       `json:"pid,omitempty"`
	Procs       int       `json:"procs"`
	MemoryBytes int64     `json:"memory_bytes"`
	Image       string    `json:"image"`
	Command     []string  `json:"command"`
	Created     time.Time `json:"created"`
	Hook        string    `json:"hook,omitempty"`
	// Net is the network mode (none, bridge, host); in bridge mode Address is the
	// container's IPv4 address on Bridge, and NAT whether it is masqueraded.
	Net     string `json:"net"`
	Address string `json:"address,omitempty"`
	Bridge  string `json:"bridge,omitempty"`
	NAT     bool   `json:"nat,omitempty"`
	// Cluster is the leader's id when the container is a cluster member (or leader).
	Cluster string `json:"cluster,omitempty"`
}
