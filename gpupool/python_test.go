package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPythonClient runs examples/python/gpupool_client.py, a client written
// from libgpu/ipc/PROTOCOL.md alone (Python's standard library, its own
// msgpack codec), against a host daemon. It skips without python3, unless
// GPUKIT_REQUIRE_PYTHON=1.
func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("GPUKIT_REQUIRE_PYTHON") == "1" {
			t.Fatal("python3 not found (GPUKIT_REQUIRE_PYTHON=1)")
		}
		t.Skip("python3 not found")
	}
	sock := serveBin(t, "--backend", "host", "--slab", "1MiB")
	cmd := exec.Command(py, filepath.Join("..", "examples", "python", "gpupool_client.py"), "--socket", sock)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "\nok\n") {
		t.Fatalf("%v:\n%s", err, out)
	}
	t.Logf("%s", out)
}
