package chaos

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Lang is the language of a chaos worker: the client library it runs.
// Every language's worker takes the flags of `keyshard chaos worker`
// (RunWorker) and reports the same records to the Sink.
type Lang string

// The languages a chaos worker can be written in.
const (
	// LangGo runs `keyshard chaos worker` (the Go SDK).
	LangGo Lang = "go"
	// LangPython runs clients/python/tools/chaos_worker.py with python3.
	LangPython Lang = "python"
	// LangNode runs clients/node/tools/chaos-worker.mjs with node.
	LangNode Lang = "node"
)

// Langs lists every language, in the order reports show them.
var Langs = []Lang{LangGo, LangPython, LangNode}

// The worker scripts of the other clients, relative to the repository
// root, and the interpreters that run them.
// Python runs unbuffered (-u), so that its logs reach a Proc's output as
// they are written.
var langScripts = map[Lang]struct {
	interp  string
	flags   []string
	script  string
	install string
}{
	LangPython: {"python3", []string{"-u"}, "clients/python/tools/chaos_worker.py", "install Python 3 (python3 on PATH)"},
	LangNode:   {"node", nil, "clients/node/tools/chaos-worker.mjs", "install Node.js 20 or later (node on PATH)"},
}

// ParseLangs parses a comma-separated list of languages ("go,python,node"),
// in the order given, without duplicates. Blank items are ignored; an
// empty list is an error.
func ParseLangs(s string) ([]Lang, error) {
	var out []Lang
	for item := range strings.SplitSeq(s, ",") {
		l := Lang(strings.ToLower(strings.TrimSpace(item)))
		switch {
		case l == "":
			continue
		case !slices.Contains(Langs, l):
			return nil, fmt.Errorf("unknown language %q: want a comma-separated list of go, python, node", item)
		case !slices.Contains(out, l):
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no language in %q: want a comma-separated list of go, python, node", s)
	}
	return out, nil
}

// FindRepo returns the Keyshard repository root at or above dir: the
// nearest directory holding go.work and clients/, or failing that the
// nearest holding go.work (whose clients may not be there yet).
func FindRepo(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	fallback := ""
	for d := abs; ; d = filepath.Dir(d) {
		if isFile(filepath.Join(d, "go.work")) {
			if isDir(filepath.Join(d, "clients")) {
				return d, nil
			}
			if fallback == "" {
				fallback = d
			}
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	if fallback != "" {
		return fallback, nil
	}
	return "", fmt.Errorf("no Keyshard repository (a directory with go.work and clients/) at or above %s: run from the repository", abs)
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// Workers starts chaos workers of every language as real processes.
type Workers struct {
	// Keyshard is the keyshard binary: a Go worker is `Keyshard chaos
	// worker ARGS`. Needed for LangGo only.
	Keyshard string
	// Repo is the repository root (FindRepo): a Python worker is
	// `python3 -u Repo/clients/python/tools/chaos_worker.py ARGS`, a Node
	// worker `node Repo/clients/node/tools/chaos-worker.mjs ARGS`. Needed
	// for LangPython and LangNode only.
	Repo string
	// LookPath finds an interpreter on PATH. Default exec.LookPath.
	LookPath func(file string) (string, error)
}

// Command returns the program and the arguments that run a worker of
// lang with the worker flags args (those of `keyshard chaos worker`). It
// checks that the program and the script exist, and says what is missing
// and what to do if not.
func (w Workers) Command(lang Lang, args ...string) (string, []string, error) {
	if lang == LangGo {
		if w.Keyshard == "" {
			return "", nil, errors.New("go workers: no keyshard binary given: build one with `go build ./cmd/keyshard`")
		}
		if !isFile(w.Keyshard) {
			return "", nil, fmt.Errorf("go workers: the keyshard binary %s does not exist: build it with `go build ./cmd/keyshard`", w.Keyshard)
		}
		return w.Keyshard, append([]string{"chaos", "worker"}, args...), nil
	}
	ls, ok := langScripts[lang]
	if !ok {
		return "", nil, fmt.Errorf("unknown worker language %q: want go, python or node", lang)
	}
	look := w.LookPath
	if look == nil {
		look = exec.LookPath
	}
	interp, err := look(ls.interp)
	if err != nil {
		return "", nil, fmt.Errorf("%s workers need %s, which is not on PATH: %s", lang, ls.interp, ls.install)
	}
	if w.Repo == "" {
		return "", nil, fmt.Errorf("%s workers: the repository root is unknown, so %s cannot be found: run from the repository", lang, ls.script)
	}
	script := filepath.Join(w.Repo, filepath.FromSlash(ls.script))
	if !isFile(script) {
		return "", nil, fmt.Errorf("%s workers: the worker script %s is missing: run from a repository that has the %s client (%s)", lang, script, lang, filepath.Dir(filepath.Dir(ls.script)))
	}
	return interp, slices.Concat(ls.flags, []string{script}, args), nil
}

// Check reports whether workers of lang can start (see Command).
func (w Workers) Check(lang Lang) error {
	_, _, err := w.Command(lang)
	return err
}

// Start starts a worker of lang as a child process named name (see
// StartProc for tee) with the worker flags args.
func (w Workers) Start(name string, tee io.Writer, lang Lang, args ...string) (*Proc, error) {
	bin, argv, err := w.Command(lang, args...)
	if err != nil {
		return nil, err
	}
	return startProc(name, tee, exec.Command(bin, argv...))
}

// WorkerArgs returns the flags of a worker that joins keyspace on server
// as member id and reports to sink, followed by extra.
func WorkerArgs(server, sink, keyspace, id string, extra ...string) []string {
	return append([]string{"--server", server, "--sink", sink, "--keyspace", keyspace, "--id", id}, extra...)
}
