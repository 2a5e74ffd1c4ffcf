package image

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	defaultSuite  = "bookworm"
	defaultMirror = "http://deb.debian.org/debian"
)

// DefaultPackages are installed into the default image on top of debootstrap's minbase
// (procps gives tests and demos ps).
var DefaultPackages = []string{"python3", "procps"}

// BuildDefault builds the default image (DefaultName, alias debian-python) from Debian
// packages with debootstrap, unless it is stored already. It needs root, debootstrap
// and the Debian mirror of the machine's apt sources, and takes about a minute.
// debootstrap's output goes to progress.
func (s *Store) BuildDefault(ctx context.Context, progress io.Writer) (*Image, error) {
	if img, err := s.Resolve(DefaultName); err == nil {
		return img, nil
	}
	lk, err := s.lockName(ctx, DefaultName)
	if err != nil {
		return nil, fmt.Errorf("build default image: %w", err)
	}
	defer lk.unlock()
	if img, err := s.Resolve(DefaultName); err == nil {
		return img, nil // built by a concurrent caller while we waited
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("build default image: debootstrap must run as root")
	}
	deboot, err := findDebootstrap()
	if err != nil {
		return nil, fmt.Errorf("build default image: %w", err)
	}
	sl, err := s.lockStore(ctx, unix.LOCK_SH)
	if err != nil {
		return nil, fmt.Errorf("build default image: %w", err)
	}
	defer sl.unlock()
	t, err := s.newTemp()
	if err != nil {
		return nil, fmt.Errorf("build default image: %w", err)
	}
	defer t.discard()

	mirror := DebianMirror(defaultSuite)
	if progress == nil {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "build %s: debootstrap %s from %s (about a minute)\n", DefaultName, defaultSuite, mirror)
	start := time.Now()
	if err := runDebootstrap(ctx, deboot, t.path, mirror, progress); err != nil {
		return nil, fmt.Errorf("build default image: %w", err)
	}
	if err := trimRootfs(t.path); err != nil {
		return nil, fmt.Errorf("build default image: %w", err)
	}
	img, err := s.importDirLocked(t.path, DefaultName)
	if err != nil {
		return nil, fmt.Errorf("build default image: %w", err)
	}
	t.path = "" // moved into the store
	fmt.Fprintf(progress, "stored %s (%s) in %s\n", DefaultName, humanBytes(img.Size), time.Since(start).Round(time.Second))
	return img, nil
}

func findDebootstrap() (string, error) {
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/debootstrap", "/sbin/debootstrap"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("debootstrap not found; install it (apt-get install debootstrap, or scripts/setup.sh)")
}

func runDebootstrap(ctx context.Context, deboot, target, mirror string, progress io.Writer) error {
	tail := &tailWriter{max: 8}
	cmd := exec.CommandContext(ctx, deboot, "--variant=minbase", "--include="+strings.Join(DefaultPackages, ","),
		defaultSuite, target, mirror)
	cmd.Stdout = tail // only the last lines, shown if it fails: its full log is hundreds of lines
	cmd.Stderr = cmd.Stdout
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	// debootstrap runs dpkg and friends below it: kill the whole group on cancel.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("debootstrap: %w", ctx.Err())
		}
		return fmt.Errorf("debootstrap %s from %s: %w: %s", defaultSuite, mirror, err, tail.String())
	}
	return nil
}

// trimRootfs drops what debootstrap leaves that an image should not carry: apt's
// package cache and lists (apt-get update restores them) and the host's hostname.
func trimRootfs(root string) error {
	var errs []error
	rmGlob := func(pattern string) {
		ms, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, m := range ms {
			if err := os.RemoveAll(m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	rmGlob("var/cache/apt/archives/*.deb")
	rmGlob("var/cache/apt/archives/partial/*")
	rmGlob("var/cache/apt/*.bin")
	ms, _ := filepath.Glob(filepath.Join(root, "var/lib/apt/lists/*"))
	for _, m := range ms {
		if b := filepath.Base(m); b != "lock" && b != "partial" {
			if err := os.RemoveAll(m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	rmGlob("var/lib/apt/lists/partial/*")
	if err := os.Remove(filepath.Join(root, "etc/hostname")); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("trim rootfs: %w", err)
	}
	return nil
}

// tailWriter keeps the last max lines written, for error messages.
type tailWriter struct {
	mu    sync.Mutex
	max   int
	lines []string
	part  string
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.part + string(p)
	parts := strings.Split(s, "\n")
	t.part = parts[len(parts)-1]
	for _, l := range parts[:len(parts)-1] {
		if l = strings.TrimSpace(l); l != "" {
			t.lines = append(t.lines, l)
		}
	}
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ls := t.lines
	if p := strings.TrimSpace(t.part); p != "" {
		ls = append(ls, p)
	}
	return strings.Join(ls, " | ")
}

// DebianMirror returns the Debian mirror the machine's apt sources use, preferring an
// entry for suite, else any ".../debian" archive, else deb.debian.org.
func DebianMirror(suite string) string {
	return mirrorFrom("/etc/apt", suite)
}

type aptSource struct {
	uris, suites []string
}

func mirrorFrom(aptDir, suite string) string {
	best, bestScore := defaultMirror, 0
	for _, src := range readAptSources(aptDir) {
		for _, u := range src.uris {
			pu, err := url.Parse(u)
			if err != nil || (pu.Scheme != "http" && pu.Scheme != "https" && pu.Scheme != "file") {
				continue
			}
			if strings.Contains(pu.Path, "security") {
				continue
			}
			score := 0
			if strings.HasSuffix(strings.TrimSuffix(pu.Path, "/"), "/debian") {
				score = 1
			}
			for _, s := range src.suites {
				if s == suite {
					score = 2
				}
			}
			if score > bestScore {
				best, bestScore = strings.TrimSuffix(u, "/"), score
			}
		}
	}
	return best
}

// readAptSources reads "deb" entries of sources.list, sources.list.d/*.list (one-line
// format) and sources.list.d/*.sources (deb822), skipping disabled ones.
func readAptSources(aptDir string) []aptSource {
	var out []aptSource
	files := []string{filepath.Join(aptDir, "sources.list")}
	lists, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.list"))
	files = append(files, lists...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		out = append(out, parseOneLine(string(b))...)
	}
	deb822, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.sources"))
	for _, f := range deb822 {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		out = append(out, parseDeb822(string(b))...)
	}
	return out
}

func parseOneLine(text string) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options: [ arch=amd64 signed-by=... ]
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) == 0 {
				continue
			}
			f = f[1:]
		}
		if len(f) < 2 {
			continue
		}
		out = append(out, aptSource{uris: []string{f[0]}, suites: []string{f[1]}})
	}
	return out
}

func parseDeb822(text string) []aptSource {
	var out []aptSource
	flush := func(p map[string]string) {
		if len(p) == 0 {
			return
		}
		if !strings.Contains(" "+p["types"]+" ", " deb ") || strings.EqualFold(p["enabled"], "no") {
			return
		}
		out = append(out, aptSource{uris: strings.Fields(p["uris"]), suites: strings.Fields(p["suites"])})
	}
	para := map[string]string{}
	last := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush(para)
			para, last = map[string]string{}, ""
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				para[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			para[last] = strings.TrimSpace(v)
		}
	}
	flush(para)
	return out
}
