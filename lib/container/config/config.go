// Package config holds the operator's runtime settings as flags and environment take them.
// It imports nothing, so the lazyfork client (cmd/lazyfork) parses the same global flags as
// the engine without linking the runtime (lib/container.Open applies them).
package config

// Config are the operator's settings for the runtime, as flags and env vars.
type Config struct {
	CgroupParent string `help:"Parent cgroup path for containers (default: lazyfork/ under this process's cgroup on v1, /lazyfork on v2; README, State on disk)." env:"LAZYFORK_CGROUP_PARENT"`
	Bridge       string `help:"Host bridge of bridge-mode containers (default lfbr0)." env:"LAZYFORK_BRIDGE"`
	Subnet       string `help:"IPv4 network of bridge-mode containers (default 10.88.0.0/16)." env:"LAZYFORK_SUBNET"`
	CRIU         string `name:"criu" help:"CRIU binary to run (default: the private one from make setup, else /usr/sbin/criu; never one found on PATH)." env:"LAZYFORK_CRIU" placeholder:"PATH"`
	// Kept as text and read when an image is unpacked (image.Store.MaxLayerBytes), so a
	// bad value fails a pull with a message naming the setting, not every command.
	// A diagnostic for bench/criu_steps.py, not a setting users need.
	KeepCRIULogs  string `name:"keep-criu-logs" hidden:"" help:"Directory every dump and restore copies CRIU's log and stats into." env:"LAZYFORK_KEEP_CRIU_LOGS" placeholder:"DIR"`
	MaxLayerBytes string `help:"Most one image may unpack to: bytes, or a number with K, M, G or T; 0 or none for no limit (default 8G)." env:"LAZYFORK_MAX_LAYER_BYTES" placeholder:"SIZE"`
}
