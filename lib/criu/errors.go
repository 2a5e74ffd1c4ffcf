package criu

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// Error is a failed CRIU call. It carries what CRIU said (errno, message), where its log is
// and the log's Error lines with the lines before them, so the cause is readable from the
// error alone.
type Error struct {
	Op      string // "dump", "restore", "version", "check"
	Errno   int    // CRIU's cr_errno, 0 if none
	Message string // CRIU's cr_errmsg
	LogPath string // "" if the call had no log
	Excerpt string // quoted log lines, "NNN: text" each
	Output  string // criu's own stdout/stderr, if it wrote any
	Err     error  // the underlying cause: context.DeadlineExceeded, an exit status, ...
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "criu %s", e.Op)
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	} else {
		b.WriteString(" failed")
	}
	if e.Errno != 0 {
		fmt.Fprintf(&b, " (errno %d: %v)", e.Errno, syscall.Errno(e.Errno))
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	if e.Output != "" {
		fmt.Fprintf(&b, "\ncriu output: %s", e.Output)
	}
	if e.LogPath != "" {
		fmt.Fprintf(&b, "\nlog %s", e.LogPath)
		if e.Excerpt != "" {
			fmt.Fprintf(&b, ":\n%s", e.Excerpt)
		}
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// harmlessError matches Error lines CRIU prints on every run on hosts without
// CAP_SYS_RESOURCE; quoting them would only hide the real cause.
func harmlessError(line string) bool {
	return strings.Contains(line, "rlimit: Can't setup RLIMIT_NOFILE")
}

// quoteLog returns the lines of the log at path that contain "Error", each with up to
// `before` preceding lines, like `grep -n -B<before> Error`, capped at maxLines lines.
func quoteLog(path string, before, maxLines int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	type line struct {
		no   int
		text string
	}
	var (
		ring    []line
		out     []string
		printed int // number of the last line quoted
		no      int
	)
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() && len(out) < maxLines {
		no++
		ring = append(ring, line{no, s.Text()})
		if len(ring) > before+1 {
			ring = ring[1:]
		}
		if !strings.Contains(s.Text(), "Error") || harmlessError(s.Text()) {
			continue
		}
		if printed != 0 && ring[0].no > printed+1 {
			out = append(out, "...")
		}
		for _, l := range ring {
			if l.no > printed && len(out) < maxLines {
				out = append(out, fmt.Sprintf("%d: %s", l.no, l.text))
				printed = l.no
			}
		}
	}
	return strings.Join(out, "\n")
}
