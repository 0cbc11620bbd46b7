package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Package integration runs llmq's binaries as separate processes against
// real services. Each binary is built once per test run and shared.

var (
	binMu    sync.Mutex
	binPaths = map[string]string{}
	binDir   string
)

// buildCmd builds ./cmd/<name> once per test binary run and returns its path.
func buildCmd(t *testing.T, name string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binPaths[name]; ok {
		return p
	}
	if binDir == "" {
		dir, err := os.MkdirTemp("", "llmq-integration-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = filepath.Dir(filepath.Dir(file))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	binPaths[name] = bin
	return bin
}
