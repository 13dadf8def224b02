package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildKeyshard builds ./cmd/keyshard of the module the go command finds
// from the working directory (without -race, to keep the children fast)
// into dir and returns the binary's path. Tests use it to get the binary
// a run starts.
func BuildKeyshard(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("find the module root (go env GOMOD): %q %v", out, err)
	}
	bin := filepath.Join(dir, "keyshard")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/keyshard")
	cmd.Dir = filepath.Dir(mod)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/keyshard: %v\n%s", err, out)
	}
	return bin, nil
}
