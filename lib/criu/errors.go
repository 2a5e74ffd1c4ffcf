package criu

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
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

// Error is one line: what failed, CRIU's first error from its log, and where the log is.
// Detail has the quoted log lines.
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
	// A service worker's message is its last log line, often the same as the cause.
	msg := strings.Join(strings.Fields(e.Message), " ")
	if m := causeRe.FindStringSubmatch(msg); m != nil {
		msg = strings.TrimSpace(m[1])
	}
	if msg != "" {
		fmt.Fprintf(&b, ": %s", msg)
	}
	if cause := firstCause(e.Excerpt); cause != "" && !strings.Contains(msg, cause) {
		fmt.Fprintf(&b, ": %s", cause)
	} else if out := strings.TrimSpace(e.Output); out != "" {
		fmt.Fprintf(&b, ": %s", strings.ReplaceAll(out, "\n", "; "))
	}
	if e.LogPath != "" {
		fmt.Fprintf(&b, " (log: %s)", e.LogPath)
	}
	return b.String()
}

// Detail is the error with CRIU's output and the quoted log lines, for a verbose report.
func (e *Error) Detail() string {
	var b strings.Builder
	b.WriteString(e.Error())
	if e.Output != "" {
		fmt.Fprintf(&b, "\ncriu output: %s", e.Output)
	}
	if e.Excerpt != "" {
		fmt.Fprintf(&b, "\n%s", e.Excerpt)
	}
	return b.String()
}

var causeRe = regexp.MustCompile(`Error \([^)]*\):\s*(.*)$`)

// firstCause extracts the message of the first "Error (file:line): msg" log line.
func firstCause(excerpt string) string {
	for _, l := range strings.Split(excerpt, "\n") {
		if m := causeRe.FindStringSubmatch(l); m != nil {
			return strings.TrimSpace(m[1])
		}
	}
	return ""
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
