package keyshardtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// forbiddenDeps are packages, or prefixes ending in "/", that a pure core
// must not depend on, even indirectly.
var forbiddenDeps = []string{
	"net", "net/http", "os/exec",
	"go.etcd.io/", "connectrpc.com/", "google.golang.org/grpc", "github.com/twmb/franz-go",
}

// clockFuncs are the package time functions a pure core must not call:
// time is an argument, and the caller owns every timer.
var clockFuncs = map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"AfterFunc": true, "NewTimer": true, "NewTicker": true, "Tick": true}

// CheckPureCore fails t if a package depends, even indirectly, on a
// network, storage or RPC package, or if its non-test source reads the
// clock or starts a goroutine. It checks the packages in dirs, or the one
// in the test's working directory if there are none. It runs
// `go list -deps` and parses the packages' files.
func CheckPureCore(t testing.TB, dirs ...string) {
	t.Helper()
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	for _, dir := range dirs {
		checkPureCore(t, dir)
	}
}

func checkPureCore(t testing.TB, dir string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: go list -deps: %v", dir, err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbiddenDeps {
			if dep == f || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
				t.Errorf("%s depends on %s; a pure core takes IO results as arguments", dir, dep)
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		timePkg := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"time"` {
				timePkg = "time"
				if imp.Name != nil {
					timePkg = imp.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: starts a goroutine; the caller owns every goroutine", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && timePkg != "" && id.Name == timePkg && clockFuncs[n.Sel.Name] {
					t.Errorf("%s: calls time.%s; time is an argument", fset.Position(n.Pos()), n.Sel.Name)
				}
			}
			return true
		})
	}
}
