package keyshardtest

import (
	"os"
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

// forbiddenCalls are calls a pure core's (non-test) source must not make:
// time is an argument, and the caller owns every goroutine.
var forbiddenCalls = []string{"time.Now(", "time.Since(", "time.Until(", "time.Sleep(", "go func"}

// CheckPureCore fails t if the package in the test's working directory
// depends on a network, storage or RPC package, or if its non-test source
// reads the clock or starts a goroutine. It runs `go list -deps`.
func CheckPureCore(t testing.TB) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbiddenDeps {
			if dep == f || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
				t.Errorf("the package depends on %s; a pure core takes IO results as arguments", dep)
			}
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, call := range forbiddenCalls {
			if strings.Contains(string(src), call) {
				t.Errorf("%s uses %s; a pure core takes time as an argument and starts no goroutines", name, call)
			}
		}
	}
}
