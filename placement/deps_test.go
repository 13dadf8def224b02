package placement_test

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPureCore keeps placement a pure core: no network, storage, RPC or
// process packages among its dependencies, and no clock reads in its code.
func TestPureCore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	forbidden := []string{"net", "net/http", "os/exec", "google.golang.org/grpc", "go.etcd.io/", "connectrpc.com/", "github.com/twmb/franz-go"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
				t.Errorf("placement depends on %s", dep)
			}
		}
	}
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution); err != nil {
			t.Fatal(err)
		}
		for _, banned := range []string{"time.Now(", "time.Since(", "time.Sleep(", "go func"} {
			if strings.Contains(string(src), banned) {
				t.Errorf("%s calls %s: placement takes time as an argument and starts no goroutines", name, banned)
			}
		}
	}
}
