package architecture_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The repository's modules, by directory, that a user may import without
// the server: the Go SDK and its pure cores, and the Kafka adapter.
var lightModules = []string{"api", "client", "clock", "hotkey", "kafka", "placement"}

// TestModuleGraphs builds a throwaway module for each way a user imports
// Keyshard and asserts that its module graph has none of the server's
// dependencies: importing the SDK (its fake server, clienttest, included),
// placement or hotkey brings connect, protobuf and xxhash, not etcd's
// server, cobra or franz-go; importing the Kafka adapter brings franz-go,
// not etcd's server or cobra.
func TestModuleGraphs(t *testing.T) {
	if testing.Short() {
		t.Skip("resolves a module graph with the go command")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		imports   []string
		forbidden []string // module paths, or prefixes ending in "/"
	}{
		{"sdk", []string{"client", "client/clienttest", "placement", "hotkey", "api/keyshard/v1"},
			[]string{"go.etcd.io/etcd/server/", "github.com/spf13/cobra", "github.com/twmb/franz-go", "github.com/twmb/franz-go/", "github.com/keyshard/keyshard"}},
		{"kafka", []string{"kafka"},
			[]string{"go.etcd.io/etcd/server/", "github.com/spf13/cobra", "github.com/keyshard/keyshard"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			graph := moduleGraph(t, root, tc.imports)
			seen := map[string]bool{}
			for _, edge := range strings.Fields(graph) {
				path, _, _ := strings.Cut(edge, "@")
				seen[path] = true
				for _, f := range tc.forbidden {
					if path == f || strings.HasSuffix(f, "/") && strings.HasPrefix(path, f) {
						t.Errorf("importing %v pulls in %s", tc.imports, edge)
					}
				}
			}
			if !seen["connectrpc.com/connect"] {
				t.Errorf("the graph has no connectrpc.com/connect; is the test reading the right module?\n%s", graph)
			}
		})
	}
}

// moduleGraph writes a module importing root's packages imports (paths
// relative to root), resolves it against the repository's modules with
// replace directives, outside the workspace, and returns `go mod graph`.
func moduleGraph(t *testing.T, root string, imports []string) string {
	t.Helper()
	dir := t.TempDir()
	var mod, src strings.Builder
	mod.WriteString("module example.com/user\n\ngo 1.26.0\n")
	for _, m := range lightModules {
		mod.WriteString("\nreplace github.com/keyshard/keyshard/" + m + " => " + filepath.Join(root, m) + "\n")
	}
	src.WriteString("package main\n\nimport (\n")
	for _, p := range imports {
		src.WriteString("\t_ \"github.com/keyshard/keyshard/" + p + "\"\n")
	}
	src.WriteString(")\n\nfunc main() {}\n")
	write(t, filepath.Join(dir, "go.mod"), mod.String())
	write(t, filepath.Join(dir, "main.go"), src.String())
	goCmd(t, dir, "mod", "tidy")
	return goCmd(t, dir, "mod", "graph")
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}
