package guard_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lazyfork/lazyfork/lib/guard"
	"github.com/lazyfork/lazyfork/lib/store"
)

// A child of the test binary with GUARD_HOLD=store:ref:log:ms takes the container's lock,
// logs "in PID", holds it for ms, logs "out PID" and exits: a second process racing on the
// same container, as `lf-dump c1` racing `lazyfork stop c1`.
func TestMain(m *testing.M) {
	if v := os.Getenv("GUARD_HOLD"); v != "" {
		os.Exit(hold(v))
	}
	os.Exit(m.Run())
}

func hold(v string) int {
	var storeDir, ref, logf string
	var ms int
	parts := strings.Split(v, ":")
	storeDir, ref, logf = parts[0], parts[1], parts[2]
	fmt.Sscan(parts[3], &ms)
	s, err := store.Open(storeDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, unlock, err := guard.Lock(context.Background(), s, ref, time.Minute)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer unlock()
	logLine(logf, "in")
	time.Sleep(time.Duration(ms) * time.Millisecond)
	logLine(logf, "out")
	return 0
}

func logLine(path, what string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(f, "%s %d\n", what, os.Getpid())
	f.Close()
}

func newStore(t *testing.T) (*store.Store, *store.Container) {
	t.Helper()
	s, err := store.Open(filepath.Join(t.TempDir(), "containers"))
	if err != nil {
		t.Fatal(err)
	}
	c := &store.Container{ID: "0123456789ab", Name: "c1", State: store.StateRunning, Created: time.Now()}
	if err := s.Put(c); err != nil {
		t.Fatal(err)
	}
	return s, c
}

func holder(t *testing.T, s *store.Store, ref, logf string, ms int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("GUARD_HOLD=%s:%s:%s:%d", s.Dir, ref, logf, ms))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}

// Processes racing on one container run one after the other: every "in" is followed by
// the same process's "out" before anyone else gets in.
func TestLockSerialisesProcesses(t *testing.T) {
	s, c := newStore(t)
	logf := filepath.Join(t.TempDir(), "log")
	var cmds []*exec.Cmd
	for i := range 4 {
		ref := c.Name
		if i%2 == 1 {
			ref = c.ID[:5] // by id prefix: the same container, the same lock
		}
		cmds = append(cmds, holder(t, s, ref, logf, 150))
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("holder: %v", err)
		}
	}
	b, err := os.ReadFile(logf)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 8 {
		t.Fatalf("log has %d lines, want 8:\n%s", len(lines), b)
	}
	for i := 0; i < len(lines); i += 2 {
		in, out := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if in[0] != "in" || out[0] != "out" || in[1] != out[1] {
			t.Fatalf("operations overlapped:\n%s", b)
		}
	}
}

// A wait that runs out while another process holds the container is ErrBusy, in about
// the wait; the lock is taken again once the holder is done.
func TestLockDeadline(t *testing.T) {
	s, c := newStore(t)
	logf := filepath.Join(t.TempDir(), "log")
	cmd := holder(t, s, c.Name, logf, 3000)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, _ := os.ReadFile(logf); strings.HasPrefix(string(b), "in ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder never took the lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	begin := time.Now()
	_, _, err := guard.Lock(context.Background(), s, c.Name, 200*time.Millisecond)
	if !errors.Is(err, guard.ErrBusy) {
		t.Fatalf("lock while held: %v, want ErrBusy", err)
	}
	if waited := time.Since(begin); waited > 2500*time.Millisecond {
		t.Errorf("waited %v for a 200ms deadline", waited)
	}
	// A cancelled context ends the wait too.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := guard.Lock(cctx, s, c.Name, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("lock with a cancelled context: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	got, unlock, err := guard.Lock(context.Background(), s, c.Name, time.Second)
	if err != nil {
		t.Fatalf("lock after the holder ended: %v", err)
	}
	unlock()
	if got.ID != c.ID {
		t.Errorf("locked %s, want %s", got.ID, c.ID)
	}
}

// Goroutines of one process are serialised as well (flock per open file description).
func TestLockSerialisesGoroutines(t *testing.T) {
	s, c := newStore(t)
	var mu sync.Mutex
	inside, maxInside := 0, 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, unlock, err := guard.Lock(context.Background(), s, c.ID, 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			inside++
			maxInside = max(maxInside, inside)
			mu.Unlock()
			time.Sleep(30 * time.Millisecond)
			mu.Lock()
			inside--
			mu.Unlock()
			unlock()
		}()
	}
	wg.Wait()
	if maxInside != 1 {
		t.Errorf("%d goroutines held the lock at once", maxInside)
	}
}

func TestLockMissing(t *testing.T) {
	s, _ := newStore(t)
	if _, _, err := guard.Lock(context.Background(), s, "nope", time.Second); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("lock of a missing container: %v", err)
	}
}

// The table: every operation against every state; a refusal is a *StateError that names
// the operation and the state, and matches ErrInvalidState.
func TestCheckTable(t *testing.T) {
	states := []string{store.StateCreating, store.StateRunning, store.StateFrozen, store.StateStopped, store.StateExited}
	want := map[guard.Op][]string{
		guard.OpDump:   {store.StateRunning},
		guard.OpFork:   {store.StateRunning, store.StateStopped},
		guard.OpStop:   {store.StateRunning},
		guard.OpStart:  {store.StateStopped},
		guard.OpFreeze: {store.StateRunning},
		guard.OpThaw:   {store.StateFrozen},
		guard.OpExec:   {store.StateRunning},
		guard.OpDelete: states,
	}
	c := &store.Container{ID: "0123456789ab", Name: "web"}
	for op, ok := range want {
		for _, st := range states {
			err := guard.Check(op, c, st)
			allowed := false
			for _, a := range ok {
				allowed = allowed || a == st
			}
			if allowed {
				if err != nil {
					t.Errorf("%s in %s: %v, want allowed", op, st, err)
				}
				continue
			}
			var se *guard.StateError
			if !errors.As(fmt.Errorf("wrapped: %w", err), &se) || se.Op != op || se.State != st || !errors.Is(err, guard.ErrInvalidState) {
				t.Errorf("%s in %s: %v, want a *StateError", op, st, err)
				continue
			}
			if msg := err.Error(); !strings.HasPrefix(msg, string(op)+" web: it is "+st) {
				t.Errorf("%s in %s: message %q", op, st, msg)
			}
		}
	}
	if err := guard.Check("teleport", c, store.StateRunning); err == nil {
		t.Error("an operation outside the table was allowed")
	}
	if got := guard.Transitions[guard.OpStop][store.StateRunning]; got != store.StateStopped {
		t.Errorf("stop leaves a running container %q", got)
	}
}
