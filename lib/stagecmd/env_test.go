package stagecmd_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Nothing in lib/ reads a setting from the environment: the mains read LAZYFORK_* through
// their flags and pass explicit values. The exceptions are the SDK's default socket
// (client.SocketFromEnv, as DOCKER_HOST) and the test helpers.
func TestLibReadsNoEnvironment(t *testing.T) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	lib := filepath.Join(strings.TrimSpace(string(root)), "lib")
	allowed := map[string]bool{"client/client.go": true}
	seen := 0
	err = filepath.WalkDir(lib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(lib, p)
		if d.IsDir() && rel == "testutil" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		seen++
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if ok && (sel.Sel.Name == "Getenv" || sel.Sel.Name == "LookupEnv") {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "os" && !allowed[rel] {
					t.Errorf("lib/%s reads the environment (os.%s): take the value as an argument or field, read by the main's flags", rel, sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 50 {
		t.Fatalf("only %d files read under %s", seen, lib)
	}
}
