package paths

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrOutside marks a path that is not inside LazyFork's state roots: stage input may
// only name what LazyFork made there, so a forged document cannot point a stage at /etc.
var ErrOutside = errors.New("outside the LazyFork state roots")

// StateRoots are the directories stage input may name: Root(), Run(), and the image store
// (Images(), which may be a symlink to a shared store; its target is trusted like the
// roots themselves).
func StateRoots() []string {
	roots := []string{Root(), Run()}
	if real, err := filepath.EvalSymlinks(Images()); err == nil && real != Images() {
		roots = append(roots, real)
	}
	return roots
}

// Within checks that p names something strictly below one of roots (never a root itself)
// and returns it cleaned. p must be absolute and have no ".." component. Each existing
// component of p below the root is checked without following it: a symlink there is
// accepted only if what it resolves to is itself strictly inside one of roots, so a link
// planted inside a root can never lead a stage out of it. The roots are configuration
// (the operator's LAZYFORK_ROOT and LAZYFORK_RUN) and may themselves be symlinks.
func Within(p string, roots ...string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path: %w", ErrOutside)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("path %q is not absolute (%w)", p, ErrOutside)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q contains \"..\" (%w)", p, ErrOutside)
		}
	}
	clean := filepath.Clean(p)
	rs := realRoots(roots)
	for _, r := range rs {
		rel, ok := below(r.given, clean)
		base := r.given
		if !ok {
			if rel, ok = below(r.real, clean); !ok {
				continue
			}
			base = r.real
		}
		if err := checkComponents(base, rel, rs); err != nil {
			return "", err
		}
		return clean, nil
	}
	for _, r := range rs {
		if clean == r.given || clean == r.real {
			return "", fmt.Errorf("path %s is a state root itself, not inside one (%w)", clean, ErrOutside)
		}
	}
	return "", fmt.Errorf("path %s is %w (%s)", clean, ErrOutside, strings.Join(givenRoots(rs), ", "))
}

// InState is Within(p, StateRoots()...).
func InState(p string) (string, error) { return Within(p, StateRoots()...) }

type root struct{ given, real string }

func realRoots(roots []string) []root {
	var out []root
	for _, r := range roots {
		if r == "" {
			continue
		}
		g, err := filepath.Abs(r)
		if err != nil {
			continue
		}
		real := g
		if e, err := filepath.EvalSymlinks(g); err == nil {
			real = e
		}
		out = append(out, root{given: g, real: real})
	}
	return out
}

func givenRoots(rs []root) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.given)
	}
	return out
}

// below returns p relative to dir when p is strictly below dir.
func below(dir, p string) (string, bool) {
	if dir == "/" {
		return strings.TrimPrefix(p, "/"), p != "/"
	}
	if !strings.HasPrefix(p, dir+"/") {
		return "", false
	}
	return strings.TrimPrefix(p, dir+"/"), true
}

// checkComponents lstats each component of rel under base, stopping at the first that
// does not exist (nothing below it can be a link yet). A symlink must resolve to a root or
// to something inside one; then the whole path, resolved, must be strictly inside a root.
func checkComponents(base, rel string, rs []root) error {
	cur := base
	parts := strings.Split(rel, "/")
	existing := base
	for _, part := range parts {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return fmt.Errorf("check %s: %w", cur, err)
		}
		existing = cur
		if fi.Mode()&os.ModeSymlink == 0 {
			continue
		}
		target, err := filepath.EvalSymlinks(cur)
		if err != nil {
			return fmt.Errorf("path %s is a symlink that does not resolve (%v): refusing it (%w)", cur, err, ErrOutside)
		}
		if !insideOrAt(target, rs) {
			return fmt.Errorf("path %s is a symlink to %s, %w: refusing to follow it", cur, target, ErrOutside)
		}
	}
	resolved, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return fmt.Errorf("check %s: %w", existing, err)
	}
	rest, _ := filepath.Rel(existing, filepath.Join(base, rel))
	resolved = filepath.Join(resolved, rest)
	for _, r := range rs {
		if _, ok := below(r.real, resolved); ok {
			return nil
		}
	}
	return fmt.Errorf("path %s resolves to %s, which is not strictly inside a root: %w", filepath.Join(base, rel), resolved, ErrOutside)
}

func insideOrAt(p string, rs []root) bool {
	for _, r := range rs {
		if _, ok := below(r.real, p); ok || p == r.real {
			return true
		}
	}
	return false
}

// Layers holds the frozen upper layers forks stack on (persistent root).
func Layers() string { return filepath.Join(Root(), "layers") }
