package criu

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v8/rpc"
)

func TestDumpOptsTranslation(t *testing.T) {
	o := DumpOptions{
		Pid:            42,
		LeaveRunning:   true,
		FreezeCgroup:   "/sys/fs/cgroup/freezer/lf/c1",
		ExternalMounts: map[string]string{"/.lazyfork/mem": "lfmem", "/a": "k"},
		CgroupMode:     CgroupSoft,
		NetworkLock:    NetworkLockNftables,
		GhostLimit:     4096,
		Notify:         func(string, int) error { return nil },
	}
	opts, err := o.criuOpts(7, 8)
	if err != nil {
		t.Fatal(err)
	}
	if opts.GetImagesDirFd() != 7 || opts.GetWorkDirFd() != 8 || opts.GetPid() != 42 {
		t.Errorf("fds/pid: %v", opts)
	}
	if !opts.GetLeaveRunning() || opts.GetShellJob() || opts.GetTcpEstablished() || !opts.GetNotifyScripts() || !opts.GetTcpSkipInFlight() {
		t.Errorf("flags: %v", opts)
	}
	if opts.GetFreezeCgroup() != o.FreezeCgroup || opts.GetGhostLimit() != 4096 {
		t.Errorf("freeze/ghost: %v", opts)
	}
	if opts.GetLogFile() != "dump.log" || opts.GetLogLevel() != DefaultLogLevel {
		t.Errorf("log: %v", opts)
	}
	if opts.GetManageCgroupsMode() != rpc.CriuCgMode_SOFT || opts.GetNetworkLock() != rpc.CriuNetworkLockMethod_NFTABLES {
		t.Errorf("modes: %v", opts)
	}
	want := []string{"mnt[/.lazyfork/mem]:lfmem", "mnt[/a]:k"}
	if !reflect.DeepEqual(opts.GetExternal(), want) {
		t.Errorf("external = %q, want %q", opts.GetExternal(), want)
	}
	if _, err := (&DumpOptions{}).criuOpts(1, 2); err == nil {
		t.Error("dump without pid accepted")
	}
}

func TestRestoreOptsTranslation(t *testing.T) {
	o := RestoreOptions{
		Root:           "/mnt/r",
		CgroupRoots:    []string{"memory:/lf/f1", "/lf/all", "name=systemd:/x"},
		ExternalMounts: map[string]string{"lfmem": "/dev/shm/lazyfork/families/f1"},
		LogFile:        "r.log",
		LogLevel:       2,
	}
	opts, err := o.criuOpts(3, 4, "/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if !opts.GetRstSibling() || !opts.GetNotifyScripts() || opts.GetRoot() != "/mnt/r" || opts.GetCgroupYard() != "/sys/fs/cgroup" {
		t.Errorf("opts: %v", opts)
	}
	if opts.GetLogFile() != "r.log" || opts.GetLogLevel() != 2 {
		t.Errorf("log: %v", opts)
	}
	if opts.NetworkLock != nil {
		t.Errorf("network lock set by default: %v", opts.GetNetworkLock())
	}
	var roots []string
	for _, r := range opts.GetCgRoot() {
		roots = append(roots, r.GetCtrl()+"|"+r.GetPath())
	}
	if want := []string{"memory|/lf/f1", "|/lf/all", "name=systemd|/x"}; !reflect.DeepEqual(roots, want) {
		t.Errorf("cgroup roots = %q, want %q", roots, want)
	}
	if want := []string{"mnt[lfmem]:/dev/shm/lazyfork/families/f1"}; !reflect.DeepEqual(opts.GetExternal(), want) {
		t.Errorf("external = %q", opts.GetExternal())
	}
	for _, bad := range []string{"memory", ":/x", "memory:rel"} {
		if _, err := (&RestoreOptions{CgroupRoots: []string{bad}}).criuOpts(1, 2, ""); err == nil {
			t.Errorf("cgroup root %q accepted", bad)
		}
	}
	if _, err := (&RestoreOptions{CgroupMode: 99}).criuOpts(1, 2, ""); err == nil {
		t.Error("bad cgroup mode accepted")
	}
}

func TestQuoteLog(t *testing.T) {
	var lines []string
	for i := 1; i <= 30; i++ {
		lines = append(lines, "(00.0000) line")
	}
	lines[2] = "(00.0000) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted"
	lines[10] = "(00.0000) Error (criu/files-reg.c:2175): File x has bad size"
	lines[11] = "(00.0000) Error (criu/files.c:1221): Unable to open fd=1"
	lines[25] = "(00.0000) Error (criu/cr-restore.c:2320): Restoring FAILED."
	path := filepath.Join(t.TempDir(), "restore.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := quoteLog(path, 5, 60)
	want := []string{
		"6: (00.0000) line", "7: (00.0000) line", "8: (00.0000) line", "9: (00.0000) line", "10: (00.0000) line",
		"11: (00.0000) Error (criu/files-reg.c:2175): File x has bad size",
		"12: (00.0000) Error (criu/files.c:1221): Unable to open fd=1",
		"...",
		"21: (00.0000) line", "22: (00.0000) line", "23: (00.0000) line", "24: (00.0000) line", "25: (00.0000) line",
		"26: (00.0000) Error (criu/cr-restore.c:2320): Restoring FAILED.",
	}
	if got != strings.Join(want, "\n") {
		t.Errorf("quoteLog =\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if q := quoteLog(path, 5, 3); len(strings.Split(q, "\n")) != 3 {
		t.Errorf("cap ignored:\n%s", q)
	}
	e := &Error{Op: "restore", Errno: 2, Message: "boom", LogPath: path, Excerpt: got, Err: os.ErrDeadlineExceeded}
	if s := e.Error(); !strings.Contains(s, "criu restore") || !strings.Contains(s, path) || !strings.Contains(s, "bad size") || !strings.Contains(s, "errno 2") {
		t.Errorf("Error() = %s", s)
	}
	if !errors.Is(e, os.ErrDeadlineExceeded) {
		t.Error("Error does not unwrap")
	}
}

func TestReadStatsRejectsGarbage(t *testing.T) {
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"short": {1, 2, 3},
		"magic": make([]byte, 16),
		"size":  {0x40, 0x59, 0x10, 0x55, 0x06, 0x33, 0x09, 0x57, 0xff, 0, 0, 0, 1},
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readStats(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCriuEnvSetsFault(t *testing.T) {
	t.Setenv("CRIU_FAULT", "1")
	n := 0
	for _, e := range criuEnv() {
		if strings.HasPrefix(e, "CRIU_FAULT=") {
			n++
			if e != "CRIU_FAULT=130" {
				t.Errorf("got %s", e)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d CRIU_FAULT entries", n)
	}
}

// Every cgroup mode has CRIU's counterpart, and a mode out of range is an error.
func TestCgroupModes(t *testing.T) {
	want := map[CgroupMode]rpc.CriuCgMode{CgroupDefault: rpc.CriuCgMode_DEFAULT, CgroupSoft: rpc.CriuCgMode_SOFT,
		CgroupFull: rpc.CriuCgMode_FULL, CgroupStrict: rpc.CriuCgMode_STRICT, CgroupNone: rpc.CriuCgMode_CG_NONE,
		CgroupProps: rpc.CriuCgMode_PROPS, CgroupIgnore: rpc.CriuCgMode_IGNORE}
	for m, w := range want {
		if got, err := m.rpc(); err != nil || got != w {
			t.Errorf("%d: %v, %v; want %v", m, got, err, w)
		}
	}
	for _, m := range []CgroupMode{-1, CgroupIgnore + 1} {
		if _, err := m.rpc(); err == nil {
			t.Errorf("mode %d accepted", m)
		}
	}
}
