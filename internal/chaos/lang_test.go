package chaos

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseLangs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Lang
		err  string
	}{
		{"go,python,node", []Lang{LangGo, LangPython, LangNode}, ""},
		{" Node , go,node,", []Lang{LangNode, LangGo}, ""},
		{"go", []Lang{LangGo}, ""},
		{"", nil, "no language"},
		{" , ", nil, "no language"},
		{"go,ruby", nil, `unknown language "ruby"`},
	} {
		got, err := ParseLangs(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseLangs(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
		case tc.err == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("ParseLangs(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// fakeRepo makes a repository root with go.work and, if scripts, both
// worker scripts, and returns it.
func fakeRepo(t *testing.T, scripts bool) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel string) {
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.work")
	if scripts {
		write("clients/python/tools/chaos_worker.py")
		write("clients/node/tools/chaos-worker.mjs")
	}
	return root
}

func TestFindRepo(t *testing.T) {
	root := fakeRepo(t, true)
	deep := filepath.Join(root, "internal", "faulttest")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	// A nested module with its own go.work but no clients/ is passed over.
	if err := os.WriteFile(filepath.Join(root, "internal", "go.work"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := FindRepo(deep); err != nil || got != root {
		t.Errorf("FindRepo(%s) = %q, %v; want %q", deep, got, err, root)
	}
	// Without clients/, the nearest go.work.
	bare := fakeRepo(t, false)
	if got, err := FindRepo(bare); err != nil || got != bare {
		t.Errorf("FindRepo(%s) = %q, %v; want %q", bare, got, err, bare)
	}
	if _, err := FindRepo(t.TempDir()); err == nil || !strings.Contains(err.Error(), "run from the repository") {
		t.Errorf("FindRepo outside a repository: %v", err)
	}
	// From this package's directory, the real repository.
	if got, err := FindRepo("."); err != nil || !isFile(filepath.Join(got, "go.work")) || !isDir(filepath.Join(got, "internal", "chaos")) {
		t.Errorf("FindRepo(.) = %q, %v", got, err)
	}
}

func TestWorkerCommand(t *testing.T) {
	repo := fakeRepo(t, true)
	bin := filepath.Join(t.TempDir(), "keyshard")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	found := func(file string) (string, error) { return "/usr/bin/" + file, nil }
	w := Workers{Keyshard: bin, Repo: repo, LookPath: found}
	args := WorkerArgs("http://127.0.0.1:1", "http://127.0.0.1:2", "ks", "w1", "--replace")
	wantArgs := []string{"--server", "http://127.0.0.1:1", "--sink", "http://127.0.0.1:2", "--keyspace", "ks", "--id", "w1", "--replace"}
	if !slices.Equal(args, wantArgs) {
		t.Fatalf("WorkerArgs = %q", args)
	}
	for _, tc := range []struct {
		lang    Lang
		program string
		argv    []string
	}{
		{LangGo, bin, append([]string{"chaos", "worker"}, wantArgs...)},
		{LangPython, "/usr/bin/python3", append([]string{"-u", filepath.Join(repo, "clients", "python", "tools", "chaos_worker.py")}, wantArgs...)},
		{LangNode, "/usr/bin/node", append([]string{filepath.Join(repo, "clients", "node", "tools", "chaos-worker.mjs")}, wantArgs...)},
	} {
		program, argv, err := w.Command(tc.lang, args...)
		if err != nil || program != tc.program || !slices.Equal(argv, tc.argv) {
			t.Errorf("Command(%s) = %q %q, %v; want %q %q", tc.lang, program, argv, err, tc.program, tc.argv)
		}
		if err := w.Check(tc.lang); err != nil {
			t.Errorf("Check(%s): %v", tc.lang, err)
		}
	}

	// What is missing, and what to do.
	missing := func(string) (string, error) { return "", errors.New("not found") }
	for _, tc := range []struct {
		w    Workers
		lang Lang
		want []string
	}{
		{Workers{}, LangGo, []string{"no keyshard binary", "go build ./cmd/keyshard"}},
		{Workers{Keyshard: filepath.Join(repo, "nope")}, LangGo, []string{"nope does not exist", "go build ./cmd/keyshard"}},
		{Workers{Repo: repo, LookPath: missing}, LangPython, []string{"need python3", "install Python 3"}},
		{Workers{Repo: repo, LookPath: missing}, LangNode, []string{"need node", "install Node.js"}},
		{Workers{LookPath: found}, LangPython, []string{"repository root is unknown", "run from the repository"}},
		{Workers{Repo: fakeRepo(t, false), LookPath: found}, LangPython, []string{"chaos_worker.py is missing", "run from a repository that has the python client"}},
		{Workers{Repo: fakeRepo(t, false), LookPath: found}, LangNode, []string{"chaos-worker.mjs is missing", "clients/node"}},
		{w, Lang("ruby"), []string{`unknown worker language "ruby"`}},
	} {
		_, _, err := tc.w.Command(tc.lang, "--id", "x")
		if err == nil {
			t.Errorf("%s with %+v: no error", tc.lang, tc.w)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s with %+v: %q does not say %q", tc.lang, tc.w, err, s)
			}
		}
	}
}

// TestWorkersStart starts a real Go worker with bad flags: it must exit
// non-zero and say which flag is wrong.
func TestWorkersStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyshard")
	}
	bin, err := BuildKeyshard(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := Workers{Keyshard: bin}.Start("w", nil, LangGo, "--sink", "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if err := p.Wait(t.Context()); err == nil {
		t.Fatal("a worker without --server exited 0")
	}
	if out := p.Output(); !strings.Contains(out, "--server, --sink, --keyspace and --id are required") {
		t.Errorf("output does not name the missing flags:\n%s", out)
	}
}
