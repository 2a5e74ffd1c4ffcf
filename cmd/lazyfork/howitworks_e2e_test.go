package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// docs/how-it-works.md runs as written: every sh block, in order, in one shell, in an
// empty directory; its check lines state the facts the text relies on.
func TestHowItWorks(t *testing.T) {
	b, err := os.ReadFile("../../docs/how-it-works.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	if len(blocks) < 8 {
		t.Fatalf("%d sh blocks in docs/how-it-works.md", len(blocks))
	}
	var script strings.Builder
	for _, m := range blocks {
		script.WriteString(m[1])
	}
	e := newEnv(t)
	dir := t.TempDir()
	path := dir + "/walkthrough.sh"
	if err := os.WriteFile(path, []byte(script.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := e.sh("cd " + dir + " && bash " + path)
	t.Logf("walkthrough output:\n%s", out)
	if code != 0 {
		t.Fatalf("walkthrough failed (exit %d):\n%s", code, errOut)
	}
	if n := strings.Count(out, "ok: "); n != strings.Count(script.String(), "\ncheck ") {
		t.Errorf("%d checks passed, the page states %d", n, strings.Count(script.String(), "\ncheck "))
	}
}
