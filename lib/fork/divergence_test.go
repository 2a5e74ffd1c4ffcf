package fork_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/container"
	"github.com/lazyfork/lazyfork/lib/fork"
	"github.com/lazyfork/lazyfork/lib/store"
	"github.com/lazyfork/lazyfork/lib/testutil"
)

// stepper changes its memory and its files one step per command and otherwise does
// nothing, so that the state at step k is known: the memory digest it prints for a
// "check" is a function of the memory it holds now. Step k rewrites page 0 (the step
// number), dirties 64 pages of its 32 MiB heap of its own (never touched before), adds
// a new 1 MiB allocation, overwrites /srv/state, appends to /srv/log, creates /srv/f-k
// and removes /srv/f-(k-2) (a whiteout in the upper).
const stepper = `
import os, hashlib
heap = bytearray(os.urandom(32 << 20))
extra = []
def digest():
    h = hashlib.sha1(heap)
    for e in extra:
        h.update(e)
    return h.hexdigest()
def handle(cmd):
    if cmd[0] == "step":
        k = int(cmd[1])
        heap[0:8] = k.to_bytes(8, "little")
        for off in range(k * (64 << 12), (k + 1) * (64 << 12), 4096):
            heap[off + 1] = (heap[off + 1] + k) % 256
        extra.append(bytearray(os.urandom(1 << 20)))
        with open("/srv/state", "w") as f:
            f.write(str(k))
        with open("/srv/log", "a") as f:
            f.write("%d\n" % k)
        open("/srv/f-%d" % k, "w").write(str(k))
        if os.path.exists("/srv/f-%d" % (k - 2)):
            os.remove("/srv/f-%d" % (k - 2))
    return digest()
os.makedirs("/srv", exist_ok=True)
open("/srv/state", "w").write("0")
print("ready", flush=True)
` + answerLoop

// answerLoop ends a workload that defines handle(cmd): it answers each command that ask
// writes to /tmp/cmd with "TOKEN handle(cmd)" in /tmp/out, and otherwise does nothing.
const answerLoop = `
import os, time
while True:
    try:
        cmd = open("/tmp/cmd").read().split()
        os.remove("/tmp/cmd")
    except FileNotFoundError:
        time.sleep(0.02)
        continue
    out = "%s %s" % (cmd[-1], handle(cmd))
    open("/tmp/out.tmp", "w").write(out)
    os.rename("/tmp/out.tmp", "/tmp/out")
`

// ask sends c a command and waits for its answer (the token it echoes first).
func ask(t *testing.T, rt *container.Runtime, c *store.Container, token string, cmd ...string) string {
	t.Helper()
	// Written whole, then renamed: the stepper polls /tmp/cmd, and reading a file the shell
	// has created but not yet written gave it an empty command that ended it (IndexError).
	execOut(t, rt, c, "sh", "-c", "echo "+strings.Join(append(cmd, token), " ")+" > /tmp/cmd.tmp && mv /tmp/cmd.tmp /tmp/cmd")
	var out string
	testutil.Eventually(t, 30*time.Second, c.ID+" to answer "+token, func() bool {
		out = tryExec(rt, c, "cat", "/tmp/out")
		return strings.HasPrefix(out, token+" ")
	})
	return strings.TrimPrefix(out, token+" ")
}

// filesAt is what /srv holds after step k.
func filesAt(k int) string {
	var log []string
	for i := 1; i <= k; i++ {
		log = append(log, strconv.Itoa(i))
	}
	fs := []string{"f-" + strconv.Itoa(k)}
	if k > 1 {
		fs = []string{"f-" + strconv.Itoa(k-1), fs[0]}
	}
	return fmt.Sprintf("state=%d log=%s files=%s", k, strings.Join(log, ","), strings.Join(fs, ","))
}

func srvState(t *testing.T, rt *container.Runtime, c *store.Container) string {
	t.Helper()
	return execOut(t, rt, c, "sh", "-c", `printf "state=%s log=%s files=%s" "$(cat /srv/state)" "$(paste -sd, /srv/log)" "$(cd /srv && ls -d f-* | sort -t- -k2n | paste -sd,)"`)
}

// A source that changes its memory and files between forks, forked after each change:
// every fork holds exactly the source's memory and files of its own fork instant, also
// after the source and the other forks changed theirs, and every fork after the first
// dumps only what the source changed (a delta), not its heap.
func TestRepeatedForksSeeTheirInstant(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "stepper", "python3", "-c", stepper)
	testutil.Eventually(t, 30*time.Second, "ready", func() bool { return len(logLines(src)) > 0 })
	const steps = 5
	want := make([]string, steps+2)
	var forks []*store.Container
	for k := 1; k <= steps; k++ {
		want[k] = ask(t, rt, src, "s"+strconv.Itoa(k), "step", strconv.Itoa(k))
		if got := srvState(t, rt, src); got != filesAt(k) {
			t.Fatalf("source at step %d: %s, want %s", k, got, filesAt(k))
		}
		res, snap, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
		if err != nil {
			t.Fatalf("fork at step %d: %v", k, err)
		}
		f, err := rt.Containers.Get(res[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		forks = append(forks, f)
		src, _ = rt.Containers.Get(src.ID)
		// 32 MiB of heap is 8,192 pages; a step changes 64 of them and adds 256.
		if k > 1 && snap.Dump.PagesWritten > 2048 {
			t.Errorf("fork at step %d dumped %d pages: the source's whole heap again, not what it changed", k, snap.Dump.PagesWritten)
		}
		t.Logf("step %d: dump %d pages (%.0f ms, frozen %.0f ms, of which the upper layer %.0f ms)", k, snap.Dump.PagesWritten, snap.Dump.WallMs, snap.Dump.FrozenMs, snap.Dump.LayerMs)
		if got := ask(t, rt, f, "c"+strconv.Itoa(k), "check"); got != want[k] {
			t.Errorf("fork at step %d: memory digest %s, want the source's %s", k, got, want[k])
		}
	}
	// The source goes on changing pages every fork maps from the family's files.
	want[steps+1] = ask(t, rt, src, "s6", "step", strconv.Itoa(steps+1))
	for i, f := range forks {
		k := i + 1
		if got := ask(t, rt, f, "d"+strconv.Itoa(k), "check"); got != want[k] {
			t.Errorf("fork %d after the source moved on: memory digest %s, want %s (its instant)", k, got, want[k])
		}
		if got := srvState(t, rt, f); got != filesAt(k) {
			t.Errorf("fork %d after the source moved on: files %s, want %s", k, got, filesAt(k))
		}
	}
	// A fork's own step stays its own.
	ask(t, rt, forks[0], "x", "step", "100")
	if got := ask(t, rt, src, "e", "check"); got != want[steps+1] {
		t.Errorf("the source saw a fork's write: digest %s, want %s", got, want[steps+1])
	}
	if got := ask(t, rt, forks[1], "e", "check"); got != want[2] {
		t.Errorf("a sibling saw a fork's write: digest %s, want %s", got, want[2])
	}
	if got := srvState(t, rt, src); got != filesAt(steps+1) {
		t.Errorf("the source's files after a fork's step: %s, want %s", got, filesAt(steps+1))
	}
}

// Generations: the source writes most of its heap after its first fork, so its next
// fork's snapshot is rebased (a fresh generation of memory files) while the first fork
// and the source still map the first generation. Both generations hold the heap until
// the last user of the first goes; then its files are freed (bytes on tmpfs), and the
// later fork, on the new generation alone, runs on, still holds its instant, and can be
// forked again.
func TestGenerationFreedWithItsLastUser(t *testing.T) {
	rt := testutil.NewRuntime(t)
	src := create(t, rt, "gens", "python3", "-c", strings.Replace(stepper, `    if cmd[0] == "step":`, `    if cmd[0] == "dirty":
        for off in range(0, len(heap), 4096):
            heap[off] = (heap[off] + 1) % 256
    if cmd[0] == "step":`, 1))
	testutil.Eventually(t, 30*time.Second, "ready", func() bool { return len(logLines(src)) > 0 })
	want1 := ask(t, rt, src, "s1", "step", "1")
	first := doFork(t, rt, src, 1)[0]
	src, _ = rt.Containers.Get(src.ID)
	fam := src.Family
	gen1 := fork.FamilyBytes(fam)
	if gen1 < 32<<20 {
		t.Fatalf("the family holds %d bytes after the first fork, want the 32 MiB heap", gen1)
	}
	want2 := ask(t, rt, src, "d", "dirty")
	res, snap, err := fork.Fork(ctx, rt, src, fork.Options{RestoreOptions: fork.RestoreOptions{N: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Memfile == nil || !snap.Memfile.Rebased {
		t.Fatalf("the fork after the source rewrote its heap was not rebased: %+v", snap.Memfile)
	}
	second, _ := rt.Containers.Get(res[0].ID)
	both := fork.FamilyBytes(fam)
	if both < gen1+(30<<20) {
		t.Errorf("after the rebase the family holds %d bytes, want both generations (%d + the heap)", both, gen1)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if b := fork.FamilyBytes(fam); b < both-(1<<20) {
		t.Errorf("gc freed the old generation (%d -> %d bytes) while the source and a fork map it", both, b)
	}
	// The old fork still maps the old generation and holds its instant.
	if got := ask(t, rt, first, "c1", "check"); got != want1 {
		t.Errorf("the first fork's digest after the rebase is %s, want %s", got, want1)
	}
	// The first fork goes: the source still maps the old generation.
	if err := rt.Delete(first); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	if b := fork.FamilyBytes(fam); b < both-(1<<20) {
		t.Errorf("gc freed the old generation (%d -> %d bytes) while the source maps it", both, b)
	}
	// The source, its last user, goes: the old generation is freed, the new one stays.
	if err := rt.Delete(src); err != nil {
		t.Fatal(err)
	}
	if err := fork.GC(rt); err != nil {
		t.Fatal(err)
	}
	after := fork.FamilyBytes(fam)
	t.Logf("family bytes: first generation %d, both %d, after its last user went %d", gen1, both, after)
	if after > both-(30<<20) {
		t.Errorf("the old generation was not freed with its last user: %d bytes before, %d after", both, after)
	}
	if got := ask(t, rt, second, "c2", "check"); got != want2 {
		t.Errorf("the fork on the new generation: digest %s, want %s", got, want2)
	}
	grand := doFork(t, rt, second, 1)[0]
	if got := ask(t, rt, grand, "c3", "check"); got != want2 {
		t.Errorf("a fork of the fork on the new generation: digest %s, want %s", got, want2)
	}
}
